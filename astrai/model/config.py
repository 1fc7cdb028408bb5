"""ModelConfig: the typed, validated description of a decoder-only transformer.

It round-trips through JSON (`config.json` in every checkpoint). Validation errors are
raised as `ConfigError` naming the field and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from astrai.errors import CheckpointError
from astrai.jsonfile import read_json_object
from astrai.typed_config import TypedConfig

RopeScalingType = Literal["none", "linear", "ntk", "llama3", "yarn"]

LIMITS = {"vocab_size": 1 << 22, "dim": 1 << 16, "n_layers": 1024, "n_heads": 1024,
          "head_dim": 1024, "ffn_dim": 1 << 20, "max_seq_len": 1 << 20, "n_experts": 1024,
          "n_shared_experts": 64}
"""The largest value each size field takes. Far above any model astrai serves (Llama 3.1
405B: 126 layers, dim 16384, vocab 128256, context 131072; Qwen2.5-1M: context 1,010,000;
DeepSeek-V3: 256 experts), and far below what a hostile config.json could make a loader
allocate or loop over: a model is built from the config before any weight is read."""
ROPE_TABLE_LIMIT = 1 << 28
"""max_seq_len x head_dim: the RoPE cos/sin tables' floats (1 GiB of fp32 together)."""


class RopeScaling(TypedConfig):
    """RoPE frequency scaling for context extension (HF `rope_scaling` semantics)."""

    type: RopeScalingType = "none"
    """Scaling method: none, linear (position interpolation), ntk (static NTK-aware base
    change), llama3 (Llama 3.1 wavelength-banded), yarn (NTK-by-parts + attention factor)."""
    factor: float = Field(1.0, gt=0, allow_inf_nan=False)
    """Context extension factor."""
    original_max_position_embeddings: int | None = None
    """Context length the model was pre-trained with (llama3, yarn)."""
    low_freq_factor: float = Field(1.0, allow_inf_nan=False)
    """llama3: wavelengths above original_len / low_freq_factor are fully scaled."""
    high_freq_factor: float = Field(4.0, allow_inf_nan=False)
    """llama3: wavelengths below original_len / high_freq_factor are left unscaled."""
    beta_fast: float = Field(32.0, allow_inf_nan=False)
    """yarn: rotations at which interpolation starts."""
    beta_slow: float = Field(1.0, allow_inf_nan=False)
    """yarn: rotations at which interpolation is complete."""
    attention_factor: float | None = Field(None, allow_inf_nan=False)
    """yarn: scale applied to cos/sin; default 0.1 * ln(factor) + 1."""


class ModelConfig(TypedConfig):
    """Architecture of a pre-norm decoder-only transformer (Llama, Qwen2, Qwen3, Mistral)."""

    vocab_size: int = Field(32000, gt=0, le=LIMITS["vocab_size"])
    """Number of token embeddings."""
    dim: int = Field(512, gt=0, le=LIMITS["dim"])
    """Residual stream width."""
    n_layers: int = Field(8, gt=0, le=LIMITS["n_layers"])
    """Number of decoder blocks (L)."""
    n_heads: int = Field(8, gt=0, le=LIMITS["n_heads"])
    """Query heads (H)."""
    n_kv_heads: int | None = None
    """Key/value heads (K) for grouped-query attention; None means n_heads (MHA)."""
    head_dim: int | None = Field(None, gt=0, le=LIMITS["head_dim"])
    """Per-head width (D); None means dim // n_heads."""
    ffn_dim: int = Field(1376, gt=0, le=LIMITS["ffn_dim"])
    """Hidden width of the SwiGLU MLP (and of each MoE expert)."""
    max_seq_len: int = Field(2048, gt=0, le=LIMITS["max_seq_len"])
    """Longest sequence the RoPE table covers."""
    rope_theta: float = Field(10000.0, gt=0, allow_inf_nan=False)
    """RoPE base frequency."""
    rope_scaling: RopeScaling = Field(default_factory=RopeScaling)
    """RoPE scaling for context extension."""
    norm_eps: float = Field(1e-5, gt=0, allow_inf_nan=False)
    """RMSNorm epsilon."""
    tie_embeddings: bool = False
    """Share the token embedding with the output projection (stored once)."""
    qkv_bias: bool = False
    """Bias on the q/k/v projections (Qwen2)."""
    qk_norm: bool = False
    """RMSNorm over head_dim of every q and k head before RoPE, with learned [head_dim] gains
    (Qwen3; "Scaling Vision Transformers to 22 Billion Parameters", Dehghani et al. 2023)."""
    sliding_window: int | None = Field(None, gt=0)
    """Attend only to the last `sliding_window` positions (Mistral); None = full causal."""
    # Mixture of experts
    n_experts: int = Field(0, ge=0, le=LIMITS["n_experts"])
    """Routed experts per MoE layer; 0 disables MoE."""
    moe_top_k: int = Field(2, gt=0)
    """Experts each token is routed to."""
    n_shared_experts: int = Field(0, ge=0, le=LIMITS["n_shared_experts"])
    """Always-on experts added to every token's output."""
    moe_layers: list[int] | None = None
    """Indices of the blocks that use MoE; None = every block (when n_experts > 0)."""
    moe_aux_loss_coef: float = Field(0.01, ge=0, allow_inf_nan=False)
    """Default weight of the load-balancing loss (the train config may override)."""
    init_std: float = Field(0.02, gt=0, allow_inf_nan=False)
    """Std of the normal init; W_o and W_down use init_std / sqrt(2L)."""
    zero_init_proj: bool = False
    """Initialise W_o and W_down to zero (modded-nanogpt): each block starts as the identity
    on the residual stream. Init only: the weights train as any other."""

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.head_dim is None:
            if self.dim % self.n_heads:
                raise ValueError(
                    f"dim ({self.dim}) is not divisible by n_heads ({self.n_heads}): "
                    "choose n_heads dividing dim, or set head_dim explicitly"
                )
            self.head_dim = self.dim // self.n_heads
        if self.n_kv_heads <= 0 or self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) is not divisible by n_kv_heads ({self.n_kv_heads}): "
                "each KV head must serve a whole group of query heads"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")
        if self.head_dim > LIMITS["head_dim"]:
            raise ValueError(f"head_dim ({self.head_dim}, dim / n_heads) is above "
                             f"{LIMITS['head_dim']}: set head_dim or n_heads")
        if self.max_seq_len * self.head_dim > ROPE_TABLE_LIMIT:
            raise ValueError(
                f"max_seq_len {self.max_seq_len} x head_dim {self.head_dim} needs RoPE tables "
                f"of {self.max_seq_len * self.head_dim * 4 / 2**30:.1f} GiB; at most "
                f"{ROPE_TABLE_LIMIT // self.head_dim} positions for this head_dim")
        if self.n_experts:
            if self.moe_top_k > self.n_experts:
                raise ValueError(
                    f"moe_top_k ({self.moe_top_k}) exceeds n_experts ({self.n_experts})"
                )
            for i in self.moe_layers or []:
                if not 0 <= i < self.n_layers:
                    raise ValueError(f"moe_layers entry {i} is outside 0..{self.n_layers - 1}")
        return self

    # -- derived ---------------------------------------------------------------
    def is_moe_layer(self, layer: int) -> bool:
        """Whether block `layer` uses a mixture-of-experts FFN."""
        if not self.n_experts:
            return False
        return self.moe_layers is None or layer in self.moe_layers

    @property
    def kv_heads(self) -> int:
        return int(self.n_kv_heads)  # type: ignore[arg-type]

    @property
    def hdim(self) -> int:
        return int(self.head_dim)  # type: ignore[arg-type]

    # -- I/O ---------------------------------------------------------------------
    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def from_dict(cls, data: dict, source: str = "model config") -> ModelConfig:
        """Validate a dict; errors name `source` and the offending field."""
        return super().from_dict(data, source)

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        return cls.from_dict(read_json_object(path, CheckpointError), source=str(path))
