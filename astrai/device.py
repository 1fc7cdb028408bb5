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
