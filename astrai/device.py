"""The one rule for `--device` everywhere (train, chat, serve-bench, quickstart).

`auto` = cuda when present, else cpu (docs/distributed.md "Precision"); anything else is
parsed by torch, and a CUDA device on a machine without CUDA is a user error now rather
than a torch error at the first tensor moved there.
"""

from __future__ import annotations

import torch

from astrai.errors import ConfigError


def resolve_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"device: '{device}' is not a device; use auto, cpu, cuda or cuda:N"
                          ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device: '{device}' requested but CUDA is not available; use cpu "
                          "or auto")
    return dev


BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
"""/proc/cpuinfo flags of bf16 arithmetic: x86 AVX512_BF16 and AMX-BF16, Arm's BF16."""


def cpu_flags_have_bf16(cpuinfo: str) -> bool:
    """Whether a /proc/cpuinfo text names a bf16 instruction set (x86 `flags`, Arm
    `Features`)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features") and set(value.split()) & set(BF16_FLAGS):
            return True
    return False


def cpu_has_bf16() -> bool | None:
    """Whether this CPU computes bf16 in hardware (else torch converts through fp32 and a
    bf16 model is slower than fp32); None when it cannot be told (no /proc/cpuinfo)."""
    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    if probe is not None and probe():
        return True
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return cpu_flags_have_bf16(f.read())
    except OSError:
        return None
