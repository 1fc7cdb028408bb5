"""Python side of csrc/: build and load the CUDA kernels, their torch custom ops, and a
pure-torch reference of each (the spec they are tested against).

    from astrai.kernels import paged_decode, paged_prefill, rotary_

The ops (registered as torch.ops.astrai.* when `astrai.kernels.ops` is first imported) run
the CUDA kernels on CUDA tensors and the references on the CPU; see
`astrai.kernels.status.kernel_status()` for what is built and why something is not.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "paged_decode": "astrai.kernels.ops",
    "paged_prefill": "astrai.kernels.ops",
    "rotary_": "astrai.kernels.ops",
    "paged_decode_ref": "astrai.kernels.reference",
    "paged_prefill_ref": "astrai.kernels.reference",
    "rotary_ref_": "astrai.kernels.reference",
}
__all__ = ["paged_decode", "paged_decode_ref", "paged_prefill", "paged_prefill_ref", "rotary_",
           "rotary_ref_"]


def __getattr__(name: str):
    # Lazy, so `python -m astrai.kernels.build` does not import itself twice.
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'astrai.kernels' has no attribute {name!r}")
