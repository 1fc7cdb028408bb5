"""Attention backends for the inference path and their selection (docs/engine.md)."""

from astrai.infer.backends.base import BackendUnsupported, InferenceBackend, write_kv
from astrai.infer.backends.registry import (
    BACKEND_NAMES,
    BackendChain,
    attn_backend,
    backend_status,
    load_backend,
    requested_backend,
    select_backend,
)
from astrai.infer.backends.torch_native import TorchNativeBackend

__all__ = [
    "BACKEND_NAMES", "BackendChain", "BackendUnsupported", "InferenceBackend",
    "TorchNativeBackend", "attn_backend", "backend_status", "load_backend",
    "requested_backend", "select_backend", "write_kv",
]
