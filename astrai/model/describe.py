"""`describe(target)`: config and statistics of a preset name, a checkpoint directory
(astrai or HF format) or a GGUF file, reading only JSON or the GGUF header — no weights are
loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from astrai.errors import CheckpointError, ConfigError
from astrai.model.checkpoint import CONFIG, read_meta
from astrai.model.gguf_file import is_gguf
from astrai.model.hf import EXPECTED, read_config
from astrai.model.presets import PRESETS, get_preset
from astrai.model.stats import model_stats


def describe(target: str | Path, seq_len: int | None = None) -> dict[str, Any]:
    """{"source", "config", "params", "flops_per_token", "weight_memory_bytes"}."""
    path = Path(target)
    if is_gguf(path):
        config, info = read_config(path)
        source: dict[str, Any] = {"kind": "checkpoint", "path": str(path), **info}
    elif path.is_dir():
        if not (path / CONFIG).is_file():
            raise CheckpointError(f"{path}: not a checkpoint (no {CONFIG}); expected a preset "
                                  f"({', '.join(PRESETS)}), {EXPECTED}")
        config, info = read_config(path)
        source = {"kind": "checkpoint", "path": str(path), **info}
        if info["format"] == "astrai":
            meta = read_meta(path)
            # Scalars only: the resolved train config can be long and belongs to `resume`.
            source["meta"] = {k: v for k, v in meta.items()
                              if isinstance(v, (str, int, float, bool)) or v is None}
    elif str(target) in PRESETS:
        config = get_preset(str(target))
        source = {"kind": "preset", "name": str(target)}
    elif path.exists():
        raise CheckpointError(f"{path}: not a directory; pass a checkpoint directory or a preset")
    else:
        raise ConfigError(
            f"'{target}' is neither a preset ({', '.join(PRESETS)}) nor a checkpoint directory"
        )
    if seq_len is not None and seq_len <= 0:
        raise ConfigError(f"--seq-len must be positive, got {seq_len}")
    return {"source": source, "config": config.model_dump(mode="json"),
            **model_stats(config, seq_len)}
