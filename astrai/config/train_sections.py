"""The sections of TrainConfig, one concern each (docs/train.md "Options").

Each field's flat name (its `--flag` and flat config key) is the section's `flag_prefix` +
the field name unless its `flag_names` says otherwise (astrai.config.section).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from astrai.config.section import Section
from astrai.errors import ConfigError

ScheduleType = Literal["cosine", "sgdr", "wsd"]
MUON_ORIGINAL_LR = 0.02
"""Muon's lr with the `original` per-matrix scale when none is given (Jordan 2024)."""


class OptimizerOptions(Section):
    """The optimizer and its update (AdamW, or Muon + AdamW; gradient clipping)."""

    flag_names: ClassVar[dict[str, str]] = {"name": "optimizer"}
    panel: ClassVar[str] = "Optimizer"

    name: Literal["adamw", "muon"] = "adamw"
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
    skip_nonfinite: int = Field(0, ge=0)
    """Skip up to N optimizer steps whose loss or gradient is not finite instead of stopping."""

    @property
    def min_lr_value(self) -> float:
        return self.max_lr / 10 if self.min_lr is None else self.min_lr

    @property
    def muon_lr_value(self) -> float:
        """Muon's peak lr: muon_lr, else max_lr (match_rms_adamw) or 0.02 (original)."""
        if self.muon_lr is not None:
            return self.muon_lr
        return self.max_lr if self.muon_adjust_lr == "match_rms_adamw" else MUON_ORIGINAL_LR


class ScheduleOptions(Section):
    """The learning-rate schedule."""

    flag_names: ClassVar[dict[str, str]] = {"name": "schedule"}
    panel: ClassVar[str] = "Schedule"

    name: ScheduleType = "cosine"
    """LR schedule: cosine (warmup, cosine to min), sgdr (warm restarts, t_mult 2), wsd."""
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    """Fraction of total steps spent in linear warmup (warmup_steps overrides)."""
    warmup_steps: int | None = Field(None, ge=0)
    """Warmup length in optimizer steps; None = warmup_ratio * total steps."""
    sgdr_cycle_steps: int | None = Field(None, gt=0)
    """sgdr: length of the first cycle after warmup; None = fit 3 cycles (1+2+4) in the run."""
    wsd_decay_ratio: float = Field(0.2, gt=0, le=1)
    """wsd: fraction of total steps in the final (quadratic) decay."""


class LoraOptions(Section):
    """LoRA adapters on a frozen base (docs/lora.md)."""

    flag_prefix: ClassVar[str] = "lora_"
    flag_names: ClassVar[dict[str, str]] = {"adapter": "adapter"}
    panel: ClassVar[str] = "LoRA"

    rank: int | None = Field(None, gt=0)
    """Train LoRA adapters of this rank on a frozen base instead of every weight (docs/lora.md);
    None = full fine-tuning. Adapters and their AdamW moments are fp32 with any base dtype."""
    alpha: float | None = Field(None, gt=0)
    """LoRA scale numerator: the update is (alpha / rank) B A x; None = 2 x rank."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout probability on the input of LoRA's A matrix during training."""
    targets: list[str] = Field(default_factory=lambda: ["all-linear"])
    """Linear layers that get adapters: all-linear, or names from q_proj, k_proj, v_proj,
    o_proj, gate_proj, up_proj, down_proj (CLI: comma-separated)."""
    adapter: str | None = None
    """A PEFT LoRA adapter directory to continue training on --model (its rank, alpha and
    targets apply; give no --lora-* option with it)."""

    @property
    def enabled(self) -> bool:
        """The run trains LoRA adapters (new ones or --adapter's), not the whole model."""
        return bool(self.rank or self.adapter)

    @property
    def spec(self):
        """The LoraSpec of new adapters (--lora-rank), or None."""
        if not self.rank:
            return None
        from astrai.model.lora import LoraSpec

        return LoraSpec.build(self.rank, self.alpha, self.dropout, self.targets)

    def given(self) -> list[str]:
        """The adapter-shape fields (alpha, dropout, targets) set to other than their
        defaults (a saved config lists every field, so "given" means "not default")."""
        return [f for f in ("alpha", "dropout", "targets")
                if getattr(self, f) != type(self).model_fields[f].get_default(
                    call_default_factory=True)]


class CheckpointOptions(Section):
    """When and where checkpoints are saved."""

    flag_prefix: ClassVar[str] = "ckpt_"
    flag_names: ClassVar[dict[str, str]] = {"keep_last": "keep_last",
                                            "format": "checkpoint_format",
                                            "async_save": "async_checkpoint"}
    panel: ClassVar[str] = "Checkpoints"

    interval: int = Field(1000, ge=0)
    """Save a checkpoint every N optimizer steps (and always at the end); 0 = only at the end."""
    dir: str | None = None
    """Where checkpoints go; None = RUN_DIR/checkpoints."""
    keep_last: int = Field(3, ge=0)
    """Keep only the newest K checkpoints; 0 = keep all."""
    format: Literal["auto", "dcp", "full"] = "auto"
    """dcp: per-rank shards; full: one file; auto: dcp under fsdp."""
    async_save: bool = False
    """dcp: save in the background."""

    def resolved_format(self, parallel: str) -> str:
        """`format` with auto resolved for executor `parallel`."""
        if self.format != "auto":
            return self.format
        return "dcp" if parallel == "fsdp" else "full"


class EvalOptions(Section):
    """Validation: its data, cadence and size."""

    flag_prefix: ClassVar[str] = "eval_"
    flag_names: ClassVar[dict[str, str]] = {"val_split": "val_split"}
    panel: ClassVar[str] = "Validation"

    data: str | None = None
    """Held-out dataset directory for validation loss / perplexity / bits per byte."""
    val_split: float = Field(0.0, ge=0, lt=1)
    """Hold out this fraction of the training samples for validation (when no eval_data)."""
    interval: int = Field(0, ge=0)
    """Validate every N optimizer steps (and at the end when validation data exists); 0 = end."""
    max_batches: int | None = Field(None, gt=0)
    """Validate on at most this many batches; None = the whole validation set."""


class PrecisionOptions(Section):
    """Number formats of the weights, the compute and the optimizer state."""

    flag_names: ClassVar[dict[str, str]] = {"mode": "precision"}
    panel: ClassVar[str] = "Precision"

    mode: str = "auto"
    """auto (bf16-mixed on CUDA, fp32 on CPU), fp32, bf16-mixed (fp32 weights, bf16
    autocast), bf16-true (bf16 weights)."""
    optimizer_state_dtype: Literal["fp32", "bf16"] = "fp32"
    """dtype of the AdamW moments; fp32 even with bf16-true weights (the paper's advice)."""
    bf16_update: Literal["auto", "nearest", "stochastic", "kahan"] = "auto"
    """bf16-true: rounding of updates into bf16 weights: nearest, stochastic (unbiased,
    seeded) or kahan (+2 B/param); auto = stochastic with bf16-true (the measured choice,
    docs/bf16-lockin.md), nearest otherwise."""

    @property
    def update_mode(self) -> str:
        """bf16_update with auto resolved (precision auto is never bf16-true)."""
        if self.bf16_update != "auto":
            return self.bf16_update
        return "stochastic" if self.mode == "bf16-true" else "nearest"


class RuntimeOptions(Section):
    """Where and how the step runs: device, processes, compile, memory, data loading."""

    panel: ClassVar[str] = "Runtime & distributed"

    device: str = "auto"
    """auto (cuda when present, else cpu), cpu, cuda, cuda:N."""
    parallel: str = "none"
    """Executor: none (one process), ddp (replicas, all-reduce), fsdp (FSDP2 sharding)."""
    nprocs: int = Field(1, gt=0)
    """Processes per node, started by torch's elastic launcher (one per GPU); ignored when
    an external torchrun already started this process."""
    nnodes: int = Field(1, gt=0)
    """Nodes of a multi-node run (each runs the same command with --rdzv-endpoint)."""
    tp: int = Field(1, gt=0)
    """Tensor-parallel degree (fsdp): each layer split over N processes."""
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


class LoggingOptions(Section):
    """What the run records: metrics.jsonl cadence, TensorBoard, MFU."""

    panel: ClassVar[str] = "Logging"

    log_interval: int = Field(1, gt=0)
    """Write a metrics.jsonl record every N optimizer steps."""
    tensorboard: bool = False
    """Also write TensorBoard event files beside metrics.jsonl, with the same scalars at the
    same steps (needs the tensorboard package, astrai's `tensorboard` extra)."""
    peak_tflops: float | None = Field(None, gt=0)
    """Peak TFLOP/s of one device for MFU; None = a matmul measured at start."""


class GuardOptions(Section):
    """The BF16 lock-in guard (docs/bf16-lockin.md)."""

    flag_prefix: ClassVar[str] = "guard_"
    panel: ClassVar[str] = "BF16 guard"

    bf16: bool | None = None
    """BF16 lock-in guard: inspect-weights' cheap checks every guard_every steps, counts in
    metrics.jsonl, a warning when locked weights appear; None = on with bf16-true precision."""
    every: int = Field(100, gt=0)
    """Steps between two lock-in checks of the guard."""
    grad_steps: int = Field(100, ge=0)
    """The guard logs per-layer gradient norms during the first N steps (the paper's advice)."""
    histograms: bool = False
    """The guard also logs per-layer log10 |g| histograms during those steps."""
    visible_warn: float = Field(0.1, ge=0.0, le=1.0)
    """Round-to-nearest bf16: warn once per group when a step past warmup changes less
    than this share of its sampled weights (update_visible/<group>); 0 = never."""


def check_lora_targets(lora: LoraOptions) -> None:
    """LoraSpec's target check as a validator error (message kept)."""
    try:
        lora.spec  # noqa: B018 - validates the targets
    except ConfigError as e:
        raise ValueError(str(e)) from None
