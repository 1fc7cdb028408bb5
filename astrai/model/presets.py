"""Named model shapes. `tiny` is for CPU tests; `1.2b` is the paper's configuration."""

from __future__ import annotations

from astrai.errors import ConfigError
from astrai.model.config import ModelConfig

PRESETS: dict[str, dict] = {
    # ~7M parameters: CPU tests and the quickstart.
    "tiny": {
        "vocab_size": 8192, "dim": 256, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2,
        "head_dim": 64, "ffn_dim": 768, "max_seq_len": 1024,
    },
    # ~58M parameters.
    "small": {
        "vocab_size": 32000, "dim": 512, "n_layers": 8, "n_heads": 8, "n_kv_heads": 4,
        "ffn_dim": 1536, "max_seq_len": 2048,
    },
    # ~117M parameters (GPT-2 small scale, tied embeddings).
    "125m": {
        "vocab_size": 32000, "dim": 768, "n_layers": 12, "n_heads": 12, "n_kv_heads": 12,
        "ffn_dim": 2304, "max_seq_len": 2048, "tie_embeddings": True,
    },
    # The 1.2B model of the BF16 lock-in case study (docs/bf16-lockin.md).
    "1.2b": {
        "vocab_size": 100000, "dim": 1536, "n_layers": 24, "n_heads": 24, "n_kv_heads": 4,
        "head_dim": 64, "ffn_dim": 6912, "max_seq_len": 2048, "norm_eps": 1e-5,
        "rope_theta": 10000.0,
    },
}


def get_preset(name: str, **overrides) -> ModelConfig:
    """The preset's config with `overrides` applied (e.g. vocab_size from a tokenizer)."""
    if name not in PRESETS:
        raise ConfigError(
            f"unknown preset '{name}': choose one of {', '.join(PRESETS)}"
        )
    return ModelConfig.from_dict({**PRESETS[name], **overrides}, source=f"preset '{name}'")
