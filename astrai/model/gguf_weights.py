"""A GGUF tensor's values as a torch tensor: the one place GGUF weight formats meet astrai's.

f32 / f16 / bf16 are taken as they are; every quantized type (q8_0, q4_0, q4_k, q5_k,
q6_k, ...) is dequantized to float32 with `gguf.quants.dequantize` (llama.cpp's own
reference of each block format). A file whose quantized tensors are all q4_0 is then kept in
astrai's int4 (`implied_quantize`): int4 is q4_0's rule and layout, and quantizing a
dequantized q4_0 group gives back its bytes (every non-zero group holds its -8 · d value),
so the model multiplies by the file's numbers at the file's size. q8_0 has no match (astrai's
int8 scales whole rows, q8_0 blocks of 32): it is dequantized, and `format_note` says so.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from astrai.errors import CheckpointError

FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
"""GGML float types astrai keeps as they are."""


def tensor_values(g: Any, info: Any) -> torch.Tensor:
    """The values of tensor `info` of GGUFFile `g` in numpy order ([rows, cols]), f32 /
    f16 / bf16 as stored, anything else dequantized to float32. A tensor whose data does not
    match its declared shape, or holds NaN / infinite values, is one CheckpointError."""
    from gguf.quants import dequantize

    qtype, shape = info.tensor_type, tuple(int(d) for d in reversed(info.shape))
    try:
        if qtype.name == "BF16":  # numpy has no bfloat16: the reader gives the raw bits
            t = torch.from_numpy(np.array(info.data).view(np.int16)).view(torch.bfloat16)
        elif qtype.name in FLOAT_TYPES:
            t = torch.from_numpy(np.array(info.data))
        else:
            t = torch.from_numpy(np.ascontiguousarray(dequantize(info.data, qtype)))
        t = t.reshape(shape)
    except (ValueError, RuntimeError, NotImplementedError, KeyError, TypeError) as e:
        raise CheckpointError(f"{g.path}: tensor {info.name} ({qtype.name}, shape "
                              f"{list(shape)}) cannot be read ({e}); the file is corrupt, "
                              "re-download or re-convert it") from None
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise CheckpointError(f"{g.path}: tensor {info.name} holds NaN or infinite values; "
                              "the file is corrupt (or its scales are), re-convert it")
    return t


KEPT = {"Q4_0": "int4"}
"""GGUF block type -> astrai's weight format holding the same numbers."""


def implied_quantize(qtypes: set[str]) -> str | None:
    """astrai's weight format for a file whose quantized tensors are all of one KEPT type."""
    quant = {q for q in qtypes if q not in FLOAT_TYPES}
    return KEPT.get(quant.pop()) if len(quant) == 1 else None


def format_note(path: Any, qtypes: set[str], dtype: torch.dtype) -> str | None:
    """One line saying which of the file's types were dequantized or kept in astrai's
    matching format (None when all are float)."""
    quant = sorted(q.lower() for q in qtypes if q not in FLOAT_TYPES)
    if not quant:
        return None
    kept = implied_quantize(qtypes)
    if kept is not None:
        return (f"{path}: {quant[0]} weights kept as astrai's {kept} (the same numbers; "
                f"as --quantize {kept})")
    to = str(dtype).removeprefix("torch.")
    return (f"{path}: {', '.join(quant)} weights dequantized to {to}; astrai has no matching "
            "format")
