"""Numeric precision of a run: parameter dtype and the autocast region around forward.

`--precision auto` is bf16-mixed on CUDA and fp32 on CPU (DESIGN.md "Device and
precision"). A precision is a small object so that others (bf16-true with fp32 optimizer
moments, fp8 ...) register beside these without touching the trainer.
"""

from __future__ import annotations

import contextlib

import torch

from astrai.errors import ConfigError


class Precision:
    """fp32: parameters, activations and optimizer moments in float32; no autocast."""

    name = "fp32"
    param_dtype = torch.float32

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class BF16Mixed(Precision):
    """fp32 master weights and moments; matmuls under bf16 autocast."""

    name = "bf16-mixed"

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


PRECISIONS: dict[str, type[Precision]] = {"fp32": Precision, "bf16-mixed": BF16Mixed}


def register_precision(cls: type[Precision]) -> type[Precision]:
    PRECISIONS[cls.name] = cls
    return cls


def resolve_device(device: str) -> torch.device:
    """`auto` = cuda when present, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"device: '{device}' is not a device; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device: '{device}' requested but CUDA is not available; use cpu or auto")
    return dev


def resolve_precision(precision: str, device: torch.device) -> Precision:
    """`auto` = bf16-mixed on CUDA, fp32 elsewhere."""
    name = precision
    if precision == "auto":
        name = "bf16-mixed" if device.type == "cuda" else "fp32"
    if name not in PRECISIONS:
        raise ConfigError(
            f"precision: unknown '{precision}'; choose auto or one of {', '.join(PRECISIONS)}"
        )
    return PRECISIONS[name]()
