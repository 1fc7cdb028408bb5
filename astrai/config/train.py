"""TrainConfig: everything a training run needs, typed and validated.

Precedence (docs/train.md "Options"): field defaults < `--config file.yaml|json` < CLI
flags. The resolved config is saved in the run directory and in every checkpoint's
meta.json, so `astrai resume RUN_DIR` needs no other argument.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from astrai.config.alignment import AlignmentOptions
from astrai.config.files import key_line, read_config_file
from astrai.errors import ConfigError

ScheduleType = Literal["cosine", "sgdr", "wsd"]
MUON_ORIGINAL_LR = 0.02
"""Muon's lr with the `original` per-matrix scale when none is given (Jordan 2024)."""


class TrainConfig(AlignmentOptions):
    """One training run (docs/train.md lists every option).

    The dpo / grpo / reward / online-* options are inherited from AlignmentOptions
    (astrai/config/alignment.py).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True,
                              use_attribute_docstrings=True)
    unknown_key_hint = "valid keys are the long options of `astrai train --help` with '_' for '-'"

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

    # -- optimizer -----------------------------------------------------------------------
    optimizer: Literal["adamw", "muon"] = "adamw"
    """adamw, or muon: Muon on the blocks' hidden matrices, AdamW on the rest."""
    max_lr: float = Field(3e-4, gt=0)
    """Peak learning rate (reached at the end of warmup)."""
    min_lr: float | None = Field(None, ge=0)
    """Final learning rate of the decay; None = max_lr / 10."""
    weight_decay: float = Field(0.1, ge=0)
    """Decoupled weight decay of matrices (not norms, biases, embeddings), Muon's too."""
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    """AdamW beta1."""
    adam_beta2: float = Field(0.95, ge=0, lt=1)
    """AdamW beta2."""
    adam_eps: float = Field(1e-8, gt=0)
    """AdamW epsilon."""
    muon_lr: float | None = Field(None, gt=0)
    """Peak Muon lr; None = max_lr (match_rms_adamw) or 0.02 (original)."""
    muon_momentum: float = Field(0.95, ge=0, lt=1)
    """Muon's Nesterov momentum."""
    muon_adjust_lr: Literal["match_rms_adamw", "original"] = "match_rms_adamw"
    """Muon's per-matrix lr scale (docs/train.md "Muon")."""
    max_grad_norm: float = Field(1.0, ge=0)
    """Clip the global gradient L2 norm to this value; 0 = measure only, never clip."""

    # -- schedule ------------------------------------------------------------------------
    schedule: ScheduleType = "cosine"
    """LR schedule: cosine (warmup, cosine to min), sgdr (warm restarts, t_mult 2), wsd."""
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    """Fraction of total steps spent in linear warmup (warmup_steps overrides)."""
    warmup_steps: int | None = Field(None, ge=0)
    """Warmup length in optimizer steps; None = warmup_ratio * total steps."""
    sgdr_cycle_steps: int | None = Field(None, gt=0)
    """sgdr: length of the first cycle after warmup; None = fit 3 cycles (1+2+4) in the run."""
    wsd_decay_ratio: float = Field(0.2, gt=0, le=1)
    """wsd: fraction of total steps in the final (quadratic) decay."""

    # -- objective -----------------------------------------------------------------------
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    """seq, sft: cross-entropy label smoothing; dpo / online-dpo with the sigmoid loss: the
    probability eps that a preference label is flipped (conservative DPO, below 0.5).
    Refused where it would be ignored (grpo, online-grpo, reward, ipo, hinge)."""
    moe_aux_loss_coef: float | None = Field(None, ge=0)
    """Weight of the MoE load-balancing loss; None = the model config's moe_aux_loss_coef."""
    strategy_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments for the strategy (used by dpo/grpo/...)."""

    # -- LoRA ----------------------------------------------------------------------------
    lora_rank: int | None = Field(None, gt=0)
    """Train LoRA adapters of this rank on a frozen base instead of every weight (docs/lora.md);
    None = full fine-tuning. Adapters and their AdamW moments are fp32 with any base dtype."""
    lora_alpha: float | None = Field(None, gt=0)
    """LoRA scale numerator: the update is (alpha / rank) B A x; None = 2 x rank."""
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout probability on the input of LoRA's A matrix during training."""
    lora_targets: list[str] = Field(default_factory=lambda: ["all-linear"])
    """Linear layers that get adapters: all-linear, or names from q_proj, k_proj, v_proj,
    o_proj, gate_proj, up_proj, down_proj (CLI: comma-separated)."""
    adapter: str | None = None
    """A PEFT LoRA adapter directory to continue training on --model (its rank, alpha and
    targets apply; give no --lora-* option with it)."""

    # -- checkpoints, metrics, validation ------------------------------------------------
    ckpt_interval: int = Field(1000, ge=0)
    """Save a checkpoint every N optimizer steps (and always at the end); 0 = only at the end."""
    ckpt_dir: str | None = None
    """Where checkpoints go; None = RUN_DIR/checkpoints."""
    keep_last: int = Field(3, ge=0)
    """Keep only the newest K checkpoints; 0 = keep all."""
    log_interval: int = Field(1, gt=0)
    """Read the figures and write a metrics.jsonl record every N steps (GPU: N>1, fewer syncs)."""
    tensorboard: bool = False
    """Also write TensorBoard event files beside metrics.jsonl, with the same scalars at the
    same steps (needs the tensorboard package, astrai's `tensorboard` extra)."""
    eval_data: str | None = None
    """Held-out dataset directory for validation loss / perplexity / bits per byte."""
    val_split: float = Field(0.0, ge=0, lt=1)
    """Hold out this fraction of the training samples for validation (when no eval_data)."""
    eval_interval: int = Field(0, ge=0)
    """Validate every N optimizer steps (and at the end when validation data exists); 0 = end."""
    eval_max_batches: int | None = Field(None, gt=0)
    """Validate on at most this many batches; None = the whole validation set."""
    peak_tflops: float | None = Field(None, gt=0)
    """Peak TFLOP/s of one device for MFU; None = a matmul measured at start."""

    # -- runtime -------------------------------------------------------------------------
    seed: int = 3407
    """Seed of model init, data order and every RNG; CPU runs are bit-reproducible."""
    device: str = "auto"
    """auto (cuda when present, else cpu), cpu, cuda, cuda:N."""
    precision: str = "auto"
    """auto (bf16-mixed on CUDA, fp32 on CPU), fp32, bf16-mixed (fp32 weights, bf16
    autocast), bf16-true (bf16 weights)."""
    optimizer_state_dtype: Literal["fp32", "bf16"] = "fp32"
    """dtype of the AdamW moments; fp32 even with bf16-true weights (the paper's advice)."""
    parallel: str = "none"
    """Executor: none (one process), ddp (replicas, all-reduce), fsdp (FSDP2 sharding)."""
    nprocs: int = Field(1, gt=0)
    """Processes per node, started by torch's elastic launcher (one per GPU); ignored when
    an external torchrun already started this process."""
    nnodes: int = Field(1, gt=0)
    """Nodes of a multi-node run (each runs the same command with --rdzv-endpoint)."""
    compile: Literal["none", "block", "model"] = "none"
    """torch.compile each decoder block, the whole model, or nothing."""
    compile_backend: str = "inductor"
    """torch.compile backend (inductor; aot_eager or eager to debug a compile problem)."""
    executor_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments for the executor."""
    gradient_checkpointing: bool = False
    """Recompute each decoder block's activations in backward (saves memory, costs time)."""
    gradient_checkpointing_modules: list[str] = Field(default_factory=lambda: ["DecoderBlock"])
    """Module types recomputed when gradient_checkpointing is on: DecoderBlock, Attention,
    SwiGLU, MoE."""
    num_workers: int = Field(0, ge=0)
    """DataLoader worker processes."""
    skip_nonfinite: int = Field(0, ge=0)
    """Skip up to N optimizer steps whose loss or gradient is not finite instead of stopping."""
    guard_bf16: bool | None = None
    """BF16 lock-in guard: inspect-weights' cheap checks every guard_every steps, counts in
    metrics.jsonl, a warning when locked weights appear; None = on with bf16-true precision."""
    guard_every: int = Field(100, gt=0)
    """Steps between two lock-in checks of the guard."""
    guard_grad_steps: int = Field(100, ge=0)
    """The guard logs per-layer gradient norms during the first N steps (the paper's advice)."""
    guard_histograms: bool = False
    """The guard also logs per-layer log10 |g| histograms during those steps."""

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.min_lr is not None and self.min_lr > self.max_lr:
            raise ValueError(f"min_lr ({self.min_lr}) exceeds max_lr ({self.max_lr})")
        if self.eval_data and self.val_split:
            raise ValueError("give either eval_data or val_split, not both")
        if self.label_smoothing:
            self._check_label_smoothing()
        if self.ref_model:
            self._check_ref_model()
        self._check_lora()
        self._check_muon()
        return self

    def _check_muon(self) -> None:
        given = [f for f in ("muon_lr", "muon_momentum", "muon_adjust_lr")
                 if getattr(self, f) != type(self).model_fields[f].get_default()]
        if self.optimizer != "muon":
            if given:
                raise ValueError(f"{given[0]}: Muon options need --optimizer muon")
            return
        if self.lora:
            raise ValueError("optimizer: Muon trains full hidden matrices, not LoRA adapters; "
                             "use --optimizer adamw with LoRA")
        if self.parallel == "fsdp":
            raise ValueError("optimizer: Muon needs each whole matrix on one process and "
                             "FSDP2 shards them; use --parallel ddp (or none) with Muon")

    def _check_lora(self) -> None:
        # set to something else than the default (a saved config lists every field)
        given = [f for f in ("lora_alpha", "lora_dropout", "lora_targets")
                 if getattr(self, f) != type(self).model_fields[f].get_default(
                     call_default_factory=True)]
        if self.adapter and (self.lora_rank or given):
            raise ValueError("adapter: the adapter directory fixes rank, alpha and targets; "
                             "drop the --lora-* options or --adapter")
        if given and not self.lora_rank and not self.adapter:
            raise ValueError(f"{given[0]}: LoRA options need --lora-rank R")
        if self.lora_rank:
            try:
                self.lora_spec  # noqa: B018 - validates the targets
            except ConfigError as e:
                raise ValueError(str(e)) from None
        if (self.lora_rank or self.adapter) and self.parallel == "fsdp":
            raise ValueError("parallel: LoRA runs with --parallel none or ddp (FSDP2 sharding "
                             "of a frozen base is not supported); use --parallel ddp")

    def _check_ref_model(self) -> None:
        """Here, not when the reference is first built: a bad --ref-model must fail before
        the run directory exists."""
        if self.strategy not in ("dpo", "grpo", "online-dpo", "online-grpo"):
            raise ValueError(f"ref_model: strategy '{self.strategy}' has no reference model "
                             "(it would be ignored); drop --ref-model")
        from astrai.model.presets import PRESETS

        if self.ref_model not in PRESETS and not Path(self.ref_model).exists():
            raise ValueError(f"ref_model: '{self.ref_model}' is neither a preset "
                             f"({', '.join(PRESETS)}), a config file, nor a checkpoint "
                             "directory")

    def _check_label_smoothing(self) -> None:
        eps, s = self.label_smoothing, self.strategy
        if s in ("dpo", "online-dpo"):
            if self.dpo_loss != "sigmoid":
                raise ValueError(f"label_smoothing: the {self.dpo_loss} loss has no label "
                                 "smoothing (conservative DPO smooths the sigmoid loss); drop "
                                 "--label-smoothing or use --dpo-loss sigmoid")
            if eps >= 0.5:
                raise ValueError(f"label_smoothing: {eps} flips more preferences than it keeps; "
                                 "conservative DPO takes a flip probability below 0.5")
        elif s in ("grpo", "online-grpo", "reward"):
            raise ValueError(f"label_smoothing: strategy '{s}' has no label smoothing (it "
                             "would be ignored); drop --label-smoothing")

    # -- derived ------------------------------------------------------------------------
    @property
    def min_lr_value(self) -> float:
        return self.max_lr / 10 if self.min_lr is None else self.min_lr

    @property
    def muon_lr_value(self) -> float:
        """Muon's peak lr: muon_lr, else max_lr (match_rms_adamw) or 0.02 (original)."""
        if self.muon_lr is not None:
            return self.muon_lr
        return self.max_lr if self.muon_adjust_lr == "match_rms_adamw" else MUON_ORIGINAL_LR

    @property
    def lora(self) -> bool:
        """The run trains LoRA adapters (new ones or --adapter's), not the whole model."""
        return bool(self.lora_rank or self.adapter)

    @property
    def lora_spec(self):
        """The LoraSpec of new adapters (--lora-rank), or None."""
        if not self.lora_rank:
            return None
        from astrai.model.lora import LoraSpec

        return LoraSpec.build(self.lora_rank, self.lora_alpha, self.lora_dropout,
                              self.lora_targets)

    def require(self, *fields: str) -> None:
        """Raise ConfigError for the first of `fields` that is unset."""
        for f in fields:
            if getattr(self, f) in (None, ""):
                flag = "--" + f.replace("_", "-")
                raise ConfigError(f"train config: `{f}` is required (pass {flag} or set it in --config)")

    # -- I/O ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "train config") -> TrainConfig:
        return super().from_dict(data, source)


def load_train_config(config_file: str | Path | None = None,
                      overrides: dict[str, Any] | None = None) -> TrainConfig:
    """defaults < config file < overrides (CLI flags; None values are 'not given')."""
    data: dict[str, Any] = {}
    if config_file is not None:
        path = Path(config_file)
        data = read_config_file(path)
        unknown = [k for k in data if k not in TrainConfig.model_fields]
        if unknown:
            line = key_line(path, unknown[0])
            where = f"line {line}: " if line else ""
            raise ConfigError(
                f"{path}: {where}unknown key `{unknown[0]}`; valid keys are the long options of "
                "`astrai train --help` with '_' for '-'"
            )
        TrainConfig.from_dict(data, source=str(path))  # field errors name the file
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return TrainConfig.from_dict(data, source=str(config_file) if config_file else "train options")
