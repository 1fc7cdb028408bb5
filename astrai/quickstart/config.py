"""QuickstartConfig: the whole newcomer path in one typed object (`astrai quickstart`).

The defaults are the recipe for 2 CPU cores: a byte-level BPE of 2048 tokens, the `tiny`
preset cut to 2 layers with tied embeddings and QK-norm on 256-token rows, batches of 8
rows; Muon (lr 0.02, Jordan's scale) on the hidden matrices with weight decay 0.3 and AdamW
2e-3 on the rest, a 30-step warmup and a cosine decay to a tenth; the number of steps is
sized by a measured step time so the run fits `time_budget_s` (at most one epoch), and a
machine too slow for the recipe's model trains a smaller one for longer. How each choice
was measured is in docs/quickstart.md ("How the recipe was chosen").
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from astrai.typed_config import TypedConfig


class QuickstartConfig(TypedConfig):
    """What `astrai quickstart` builds, and how long it may take."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    out: str = "runs/quickstart"
    """Directory for everything made: tokenizer/, data/, run/ (checkpoints), summary.json."""
    corpus: str | None = None
    """Directory holding shakespeare_train.jsonl and shakespeare_val.jsonl; None = the
    corpus bundled with astrai (examples/data/shakespeare: 39 works, 4.7 MB)."""
    overwrite: bool = False
    """Replace an existing `out` directory."""

    # -- tokenizer and data ---------------------------------------------------------------
    vocab_size: int = Field(2048, ge=300)
    """Byte-level BPE vocabulary size (256 bytes + special tokens + merges)."""
    seq_len: int = Field(256, ge=16)
    """Tokens per packed training row (and the model's context length)."""

    # -- model ----------------------------------------------------------------------------
    model: str = "tiny"
    """Model preset the overrides apply to."""
    model_overrides: dict[str, Any] = Field(
        default_factory=lambda: {"n_layers": 2, "tie_embeddings": True, "qk_norm": True})
    """ModelConfig fields changed on the preset (vocab_size and max_seq_len are set from
    the tokenizer and seq_len)."""

    fallback_overrides: dict[str, Any] | None = Field(
        default_factory=lambda: {"dim": 128, "n_heads": 2, "n_kv_heads": 1, "ffn_dim": 384})
    """ModelConfig fields changed, on top of model_overrides, for the smaller model a slow
    machine trains instead (docs/quickstart.md "A slow or busy machine"); None = never."""
    fallback_below_steps: int = Field(450, ge=0)
    """Train the fallback model when the time budget gives the recipe's model fewer steps
    than this (about 2/3 of the recipe's length on 2 idle cores). Only when steps are sized,
    not with `steps`."""

    # -- optimisation ---------------------------------------------------------------------
    batch_size: int = Field(8, gt=0)
    """Rows per optimizer step."""
    optimizer: Literal["adamw", "muon"] = "muon"
    """muon: Muon on the blocks' hidden matrices + AdamW on embeddings and norms (train's
    --optimizer muon), or adamw on everything; the sizing step times the same optimizer."""
    muon_lr: float = Field(0.02, gt=0)
    """Muon's peak learning rate (with muon_adjust_lr; cosine-scheduled like max_lr)."""
    muon_adjust_lr: Literal["original", "match_rms_adamw"] = "original"
    """Muon's per-matrix lr scale (train's --muon-adjust-lr): original is Jordan's
    sqrt(max(1, rows / cols))."""
    weight_decay: float = Field(0.3, ge=0)
    """Decoupled weight decay of the weight matrices (with the tied embedding excluded, the
    hidden matrices: Muon's)."""
    max_lr: float = Field(2e-3, gt=0)
    """Peak AdamW learning rate (betas 0.9, 0.95; clip 1.0)."""
    min_lr: float = Field(2e-4, ge=0)
    """Learning rate at the end of the cosine decay."""
    warmup_steps: int = Field(30, ge=0)
    """Linear warmup steps (fewer when the run is shorter than 4x this)."""
    steps: int | None = Field(None, gt=0)
    """Optimizer steps; None = sized from a measured step time to fit time_budget_s."""
    max_epochs: float = Field(1.0, gt=0)
    """Upper bound on the sized run, in passes over the data: the recipe's full length (a
    fast machine stops there)."""
    time_budget_s: float = Field(240.0, gt=0)
    """Wall-clock seconds the whole quickstart aims to take (the training steps are sized
    to what is left after the tokenizer, the data and the measured step time)."""
    seed: int = 3407
    """Seed of the model init, data order and the sample."""
    device: str = "auto"
    """auto (cuda when present, else cpu), cpu, cuda, cuda:N."""
    threads: int | None = Field(None, gt=0)
    """CPU threads for the run; None = the faster of 1 and torch's default, measured while
    sizing (torch's default with a fixed `steps`)."""

    # -- sample ---------------------------------------------------------------------------
    sample_prompt: str = "MACBETH.\n"
    """Text the finished model continues (speaker names end with a period in the corpus)."""
    sample_tokens: int = Field(120, gt=0)
    """Tokens generated for the sample."""
    temperature: float = Field(0.8, ge=0)
    """Sampling temperature of the sample (0 = greedy)."""

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "quickstart options"
                  ) -> QuickstartConfig:
        return super().from_dict(data, source)
