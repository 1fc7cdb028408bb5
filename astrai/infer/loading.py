"""Model and tokenizer for an engine, from a checkpoint directory (chat needs nothing else)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from astrai.device import resolve_device
from astrai.errors import CheckpointError, ConfigError
from astrai.infer.config import DTYPES
from astrai.model.gguf_file import is_gguf


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """None/'auto' = bf16 on CUDA, fp32 on CPU (docs/distributed.md "Precision")."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ConfigError(f"dtype '{dtype}': use auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def dtype_warning(device: str | torch.device, dtype: str | torch.dtype | None) -> str | None:
    """One line when bf16 on this CPU would be slower than fp32 (no AVX512_BF16 / AMX /
    Arm BF16: torch then converts every bf16 product through fp32), else None."""
    from astrai.device import cpu_has_bf16

    dev = resolve_device(device)
    if dev.type != "cpu" or resolve_dtype(dtype, dev) != torch.bfloat16:
        return None
    if cpu_has_bf16() is not False:
        return None
    return ("warning: --dtype bfloat16 on a CPU without bf16 instructions (AVX512_BF16, AMX) "
            "runs slower than float32; drop --dtype, or try --quantize int8")


def resolve_quantize(quantize: str | None) -> str | None:
    """None/'none' = the weights as loaded; otherwise a format of astrai.model.quant."""
    from astrai.model.quant import QUANTIZE

    if quantize in (None, "none"):
        return None
    if quantize not in QUANTIZE:
        raise ConfigError(f"--quantize '{quantize}': use none or {', '.join(QUANTIZE)}")
    return quantize


def load_model(path: str | Path, *, device: str | torch.device = "auto",
               dtype: str | torch.dtype | None = None,
               adapter: str | Path | None = None,
               quantize: str | None = None) -> torch.nn.Module:
    """An eval-mode Transformer from an astrai checkpoint, a HF Llama / Qwen2 / Mistral
    directory or a GGUF file (`astrai.model.hf.load_pretrained`), with a LoRA adapter merged in: `adapter`
    (a PEFT directory) or, for a LoRA run's checkpoint, its own `adapter/`; then, with
    `quantize` ('int8'), its linear weights quantized (astrai.model.quant, docs/engine.md
    "Weight formats"; a GGUF file of q4_0 weights is int4 unless `quantize` says otherwise)."""
    from astrai.model.adapter import find_adapter, merge_adapter
    from astrai.model.hf import load_pretrained

    quantize = resolve_quantize(quantize)  # a bad name fails before the weights load
    dev = resolve_device(device)
    path = Path(path)
    gguf = is_gguf(path)
    if not path.is_dir() and not gguf:
        raise CheckpointError(f"{path}: not a checkpoint directory; point to an astrai "
                              "checkpoint, a HF model directory or a .gguf file")
    if gguf and quantize is None:  # an all-q4_0 file stays int4 (gguf_weights.KEPT)
        from astrai.model.gguf_load import gguf_quantize

        quantize = gguf_quantize(path)
    adapter = find_adapter(path, adapter)
    model, _, _ = load_pretrained(path, device=dev, dtype=resolve_dtype(dtype, dev))
    if adapter is not None:
        merge_adapter(model, adapter)
    if quantize is not None:
        from astrai.model.quant import quantize_model

        quantize_model(model, quantize)
    return model.eval()


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer stored in the checkpoint directory, or the one a GGUF file's metadata
    describes (astrai.data.tokenizer.Tokenizer.from_gguf); None when there is none."""
    from astrai.data.tokenizer import Tokenizer

    if is_gguf(path):
        return Tokenizer.from_gguf(path)
    if not (Path(path) / "tokenizer.json").is_file():
        return None
    return Tokenizer.load(path)
