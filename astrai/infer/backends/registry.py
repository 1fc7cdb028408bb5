"""Which attention backend serves a step (docs/engine.md "Attention backends").

Selection, most specific first: an explicit choice (Engine(backend=...)), the
`attn_backend(name)` context manager (a contextvar, so threads and asyncio tasks each keep
their own, like torch.nn.attention.sdpa_kernel), the ASTRAI_BACKEND environment variable;
otherwise every available backend in the priority order cuda > flash > torch_native.

Automatic selection falls through: a backend that cannot serve a call (dtype, shape,
device) hands it to the next in that order. An explicitly requested backend raises instead.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from astrai.errors import ConfigError
from astrai.infer.backends.base import BackendUnsupported

BACKEND_NAMES = ("cuda", "flash", "torch_native")
"""Known backends, in default priority order."""
ENV_VAR = "ASTRAI_BACKEND"

_MODULES = {
    "cuda": ("astrai.infer.backends.cuda", "CudaBackend"),
    "flash": ("astrai.infer.backends.flash", "FlashAttnBackend"),
    "torch_native": ("astrai.infer.backends.torch_native", "TorchNativeBackend"),
}
_requested: ContextVar[str | None] = ContextVar("astrai_attn_backend", default=None)
log = logging.getLogger("astrai.infer")


def _check_name(name: str, source: str) -> str:
    if name not in BACKEND_NAMES:
        raise ConfigError(f"{source}: unknown attention backend '{name}'; use one of "
                          f"{', '.join(BACKEND_NAMES)}")
    return name


@contextlib.contextmanager
def attn_backend(name: str) -> Iterator[None]:
    """Use backend `name` for engine steps run inside this block (this thread/task only)."""
    token = _requested.set(_check_name(name, "attn_backend"))
    try:
        yield
    finally:
        _requested.reset(token)


def requested_backend() -> str | None:
    """The context manager's choice, else ASTRAI_BACKEND, else None (automatic)."""
    name = _requested.get()
    if name is not None:
        return name
    env = os.environ.get(ENV_VAR, "").strip()
    return _check_name(env, ENV_VAR) if env else None


def load_backend(name: str) -> tuple[Any | None, str | None]:
    """(instance, None) when backend `name` is usable here, else (None, why not)."""
    module, cls_name = _MODULES[_check_name(name, "backend")]
    try:
        cls = getattr(importlib.import_module(module), cls_name)
    except (ImportError, AttributeError) as e:
        return None, f"{module}.{cls_name} is not importable ({e})"
    probe = getattr(cls, "unavailable_reason", None)
    reason = probe() if callable(probe) else None
    if reason is not None:
        return None, reason
    try:
        return cls(), None
    except Exception as e:  # noqa: BLE001 - a backend that fails to start is unavailable
        return None, f"{type(e).__name__}: {e}"


def backend_status() -> dict[str, str | None]:
    """Each backend name -> None when available here, else why not."""
    return {name: load_backend(name)[1] for name in BACKEND_NAMES}


class BackendChain:
    """An AttentionBackend that serves each call with the first backend able to.

    `explicit`: the user named the (single) backend, so a call it cannot serve raises
    ConfigError rather than falling through."""

    def __init__(self, backends: list[Any], explicit: bool = False) -> None:
        if not backends:
            raise ConfigError("no attention backend is available")
        self.backends = backends
        self.explicit = explicit
        self._warned: set[tuple[str, str]] = set()

    @property
    def name(self) -> str:
        return self.backends[0].name

    def attend(self, q, k, v, layer, ctx):
        for b in self.backends:
            supports = getattr(b, "supports", None)
            reason = supports(q, ctx) if supports is not None else None
            if reason is None:
                try:
                    return b.attend(q, k, v, layer, ctx)
                except BackendUnsupported as e:
                    reason = str(e) or "unsupported call"
            if self.explicit:
                raise ConfigError(f"attention backend '{b.name}' cannot serve this call: "
                                  f"{reason}; choose another backend")
            if (b.name, reason) not in self._warned:
                self._warned.add((b.name, reason))
                log.warning("attention backend %s falls through: %s", b.name, reason)
        raise ConfigError("no attention backend can serve this call")


def select_backend(name: str | None = None) -> BackendChain:
    """The chain for `name` (explicit: that backend alone, raising when unavailable), or
    for `requested_backend()`, or every available backend by priority."""
    name = name if name is not None else requested_backend()
    if name is not None:
        backend, reason = load_backend(_check_name(name, "backend"))
        if backend is None:
            raise ConfigError(f"attention backend '{name}' is not available: {reason}")
        return BackendChain([backend], explicit=True)
    chain = [b for b, _ in map(load_backend, BACKEND_NAMES) if b is not None]
    return BackendChain(chain)
