"""TrainConfig: everything a training run needs, typed, validated, nested by concern.

Sections (astrai/config/train_sections.py, alignment.py) group the options as torchtitan's
job config does: `optimizer.max_lr`, `lora.rank`, `alignment.rollout.max_tokens`. Each
field keeps one flat name, its `--flag` (astrai.config.section), and a config file or saved
config may use either form. Precedence (docs/train.md "Options"): field defaults <
`--config file.yaml|json` < CLI flags. The resolved config is saved (nested) in the run
directory and in every checkpoint's meta.json, so `astrai resume RUN_DIR` needs no other
argument; flat configs saved by older runs load too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from astrai.config.alignment import AlignmentOptions
from astrai.config.files import key_line, read_config_file
from astrai.config.section import flag, flat_fields, merge, nest, unknown_keys
from astrai.config.train_sections import (
    CheckpointOptions,
    EvalOptions,
    GuardOptions,
    LoggingOptions,
    LoraOptions,
    OptimizerOptions,
    PrecisionOptions,
    RuntimeOptions,
    ScheduleOptions,
    check_lora_targets,
)
from astrai.errors import ConfigError
from astrai.typed_config import TypedConfig

UNKNOWN_KEY_HINT = ("valid keys are the long options of `astrai train --help` with '_' for "
                    "'-', or the sections' fields (docs/train.md \"Options\")")


class TrainConfig(TypedConfig):
    """One training run (docs/train.md lists every option)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True,
                              use_attribute_docstrings=True)
    unknown_key_hint = UNKNOWN_KEY_HINT

    # -- what to train -------------------------------------------------------------------
    strategy: str = "seq"
    """Training objective: a registered strategy name (seq, sft; dpo, grpo, ... when present)."""
    data: str | None = None
    """Dataset directory written by `astrai preprocess` (required)."""
    model: str | None = None
    """Preset name, model config file (.json/.yaml), astrai checkpoint or HF model directory."""
    model_overrides: dict[str, Any] = Field(default_factory=dict)
    """ModelConfig fields to override on a preset or config file (CLI: n_layers=2)."""
    out: str | None = None
    """Run directory: resolved config, metrics.jsonl, checkpoints/step_N, `latest` pointer."""

    # -- batch and length ----------------------------------------------------------------
    batch_size: int = Field(8, gt=0)
    """Sequences per micro-batch on each device (batch_per_device)."""
    grad_accum_steps: int = Field(1, gt=0)
    """Micro-batches per optimizer step; the loss is normalised over the whole window."""
    window_size: int | None = Field(None, gt=0)
    """Sequence length; None = the dataset's packed length. Longer rows are cut to it."""

    # -- length of training --------------------------------------------------------------
    epochs: int = Field(1, gt=0)
    """Passes over the dataset (ignored when max_steps is set)."""
    max_steps: int | None = Field(None, gt=0)
    """Stop after this many optimizer steps (epochs continue as needed); None = epochs."""

    # -- objective -----------------------------------------------------------------------
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    """seq, sft: cross-entropy label smoothing; dpo / online-dpo with the sigmoid loss: the
    probability eps that a preference label is flipped (conservative DPO, below 0.5).
    Refused where it would be ignored (grpo, online-grpo, reward, ipo, hinge)."""
    moe_aux_loss_coef: float | None = Field(None, ge=0)
    """Weight of the MoE load-balancing loss; None = the model config's moe_aux_loss_coef."""
    strategy_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments for the strategy (used by dpo/grpo/...)."""

    seed: int = 3407
    """Seed of model init, data order and every RNG; CPU runs are bit-reproducible."""

    # -- sections (astrai/config/train_sections.py, alignment.py) -------------------------
    optimizer: OptimizerOptions = Field(default_factory=OptimizerOptions)
    """The optimizer and its update."""
    schedule: ScheduleOptions = Field(default_factory=ScheduleOptions)
    """The learning-rate schedule."""
    lora: LoraOptions = Field(default_factory=LoraOptions)
    """LoRA adapters (docs/lora.md)."""
    checkpoint: CheckpointOptions = Field(default_factory=CheckpointOptions)
    """Checkpoint cadence and place."""
    eval: EvalOptions = Field(default_factory=EvalOptions)
    """Validation."""
    precision: PrecisionOptions = Field(default_factory=PrecisionOptions)
    """Number formats."""
    runtime: RuntimeOptions = Field(default_factory=RuntimeOptions)
    """Device, processes, compile, memory, data loading."""
    logging: LoggingOptions = Field(default_factory=LoggingOptions)
    """Metrics records."""
    guard: GuardOptions = Field(default_factory=GuardOptions)
    """The BF16 lock-in guard."""
    alignment: AlignmentOptions = Field(default_factory=AlignmentOptions)
    """dpo / grpo / reward / online-* options (astrai/config/alignment.py)."""

    @model_validator(mode="before")
    @classmethod
    def _nest(cls, data: Any) -> Any:
        """Flat keys (older saved configs, flat config files, keyword arguments) -> sections."""
        return nest(cls, data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        opt = self.optimizer
        if opt.min_lr is not None and opt.min_lr > opt.max_lr:
            raise ValueError(f"min_lr ({opt.min_lr}) exceeds max_lr ({opt.max_lr})")
        if self.eval.data and self.eval.val_split:
            raise ValueError("give either eval_data or val_split, not both")
        if self.label_smoothing:
            self._check_label_smoothing()
        if self.alignment.ref_model:
            self._check_ref_model()
        self._check_lora()
        self._check_muon()
        self._check_checkpoint_format()
        if self.runtime.tp > 1 and self.runtime.parallel != "fsdp":
            raise ValueError(f"tp: tensor parallelism composes with FSDP on the data-parallel "
                             f"dimension; add --parallel fsdp (got '{self.runtime.parallel}')")
        return self

    def _check_checkpoint_format(self) -> None:
        ckpt = self.checkpoint
        fmt = ckpt.resolved_format(self.runtime.parallel)
        if ckpt.async_save and fmt != "dcp":
            raise ValueError("async_checkpoint: asynchronous saves write DCP checkpoints; add "
                             "--checkpoint-format dcp or drop --async-checkpoint")
        if fmt == "dcp" and self.lora.enabled:
            raise ValueError("checkpoint_format: a LoRA run saves its adapter in PEFT's format "
                             "(full checkpoints); drop --checkpoint-format dcp")

    def _check_muon(self) -> None:
        opt, defaults = self.optimizer, OptimizerOptions.model_fields
        given = [f for f in ("muon_lr", "muon_momentum", "muon_adjust_lr")
                 if getattr(opt, f) != defaults[f].get_default()]
        if opt.name != "muon":
            if given:
                raise ValueError(f"{given[0]}: Muon options need --optimizer muon")
            return
        if self.lora.enabled:
            raise ValueError("optimizer: Muon trains full hidden matrices, not LoRA adapters; "
                             "use --optimizer adamw with LoRA")
        if self.runtime.parallel == "fsdp":
            raise ValueError("optimizer: Muon needs each whole matrix on one process and "
                             "FSDP2 shards them (and --tp splits them); use --parallel ddp "
                             "(or none) with Muon")

    def _check_lora(self) -> None:
        lora = self.lora
        given = ["lora_" + f for f in lora.given()]
        if lora.adapter and (lora.rank or given):
            raise ValueError("adapter: the adapter directory fixes rank, alpha and targets; "
                             "drop the --lora-* options or --adapter")
        if given and not lora.rank and not lora.adapter:
            raise ValueError(f"{given[0]}: LoRA options need --lora-rank R")
        if lora.rank:
            check_lora_targets(lora)
        if lora.enabled and self.runtime.parallel == "fsdp":
            raise ValueError("parallel: LoRA runs with --parallel none or ddp (FSDP2 sharding "
                             "of a frozen base is not supported); use --parallel ddp")

    def _check_ref_model(self) -> None:
        """Here, not when the reference is first built: a bad --ref-model must fail before
        the run directory exists."""
        ref = self.alignment.ref_model
        if self.strategy not in ("dpo", "grpo", "online-dpo", "online-grpo"):
            raise ValueError(f"ref_model: strategy '{self.strategy}' has no reference model "
                             "(it would be ignored); drop --ref-model")
        from astrai.model.presets import PRESETS

        if ref not in PRESETS and not Path(ref).exists():
            raise ValueError(f"ref_model: '{ref}' is neither a preset "
                             f"({', '.join(PRESETS)}), a config file, nor a checkpoint "
                             "directory")

    def _check_label_smoothing(self) -> None:
        eps, s, loss = self.label_smoothing, self.strategy, self.alignment.dpo_loss
        if s in ("dpo", "online-dpo"):
            if loss != "sigmoid":
                raise ValueError(f"label_smoothing: the {loss} loss has no label "
                                 "smoothing (conservative DPO smooths the sigmoid loss); drop "
                                 "--label-smoothing or use --dpo-loss sigmoid")
            if eps >= 0.5:
                raise ValueError(f"label_smoothing: {eps} flips more preferences than it keeps; "
                                 "conservative DPO takes a flip probability below 0.5")
        elif s in ("grpo", "online-grpo", "reward"):
            raise ValueError(f"label_smoothing: strategy '{s}' has no label smoothing (it "
                             "would be ignored); drop --label-smoothing")

    def require(self, *fields: str) -> None:
        """Raise ConfigError for the first of the top-level `fields` that is unset."""
        for f in fields:
            if getattr(self, f) in (None, ""):
                raise ConfigError(f"train config: `{f}` is required (pass {flag((f,), type(self))} "
                                  "or set it in --config)")

    # -- I/O ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The nested form (what a run saves)."""
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "train config") -> TrainConfig:
        """Nested, flat (older runs' saved configs) or mixed keys."""
        return super().from_dict(data, source)


def load_train_config(config_file: str | Path | None = None,
                      overrides: dict[str, Any] | None = None) -> TrainConfig:
    """defaults < config file (nested or flat keys) < overrides (flat, the CLI flags; None
    values are 'not given')."""
    data: dict[str, Any] = {}
    if config_file is not None:
        path = Path(config_file)
        data = read_config_file(path)
        unknown = unknown_keys(TrainConfig, data)
        if unknown:
            line = key_line(path, unknown[0])
            where = f"line {line}: " if line else ""
            raise ConfigError(f"{path}: {where}unknown key `{'.'.join(unknown[0])}`; "
                              f"{UNKNOWN_KEY_HINT}")
        data = nest(TrainConfig, data)
        TrainConfig.from_dict(data, source=str(path))  # field errors name the file
    flags = nest(TrainConfig, {k: v for k, v in (overrides or {}).items() if v is not None})
    return TrainConfig.from_dict(merge(data, flags),
                                 source=str(config_file) if config_file else "train options")


def saved_option(saved: dict[str, Any], name: str) -> Any:
    """The option of flat name `name` (`ckpt_dir`) in a saved train config of either form:
    nested (runs now) or flat (older runs); None when absent. Reads the mapping as saved,
    without validating the rest of it."""
    node: Any = nest(TrainConfig, saved)
    for part in flat_fields(TrainConfig)[name].path:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node
