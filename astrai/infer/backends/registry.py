"""Which attention backend serves a step (docs/engine.md "Attention backends").

Selection, most specific first: an explicit choice (Engine(backend=...)), the
`attn_backend(name)` context manager (a contextvar, so threads and asyncio tasks each keep
their own, like torch.nn.attention.sdpa_kernel), the ASTRAI_BACKEND environment variable;
otherwise every available backend in the priority order cuda > flash > torch_native.

Automatic selection falls through: a backend that cannot serve a call (dtype, shape,
device) hands it to the next in that order. An explicitly requested backend raises instead.

Automatic selection also checks each accelerated backend (every one before torch_native, the
reference) on its first decode call and its first prefill call: the reference attends the
same call (writing the same K/V) and the two outputs are compared row by row (cosine
similarity at least 0.99). A backend that differs, or raises, is dropped from the chain with
one warning naming it, and the reference's output is used: a kernel never run on this GPU
before cannot make the engine answer wrongly.
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
from astrai.infer.backends.base import BackendUnsupported, mismatch

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
        self.checked: set[tuple[str, bool]] = set()
        """(backend, decode call?) pairs compared with the reference once."""
        self.dropped: dict[str, str] = {}
        """Backends switched off by their check, and why."""

    @property
    def name(self) -> str:
        return self.backends[0].name

    def attend(self, q, k, v, layer, ctx):
        for b in self.backends:
            supports = getattr(b, "supports", None)
            reason = supports(q, ctx) if supports is not None else None
            if reason is None:
                try:
                    return self._attend(b, q, k, v, layer, ctx)
                except BackendUnsupported as e:
                    reason = str(e) or "unsupported call"
            if self.explicit:
                raise ConfigError(f"attention backend '{b.name}' cannot serve this call: "
                                  f"{reason}; choose another backend")
            if (b.name, reason) not in self._warned:
                self._warned.add((b.name, reason))
                log.warning("attention backend %s falls through: %s", b.name, reason)
        raise ConfigError("no attention backend can serve this call")


    def _attend(self, b: Any, q, k, v, layer, ctx):
        """b's output, compared with the reference's on b's first call of this kind."""
        ref = self.backends[-1]
        key = (b.name, bool(getattr(ctx.cache, "is_decode", False)))
        if self.explicit or b is ref or ref.name != "torch_native" or key in self.checked:
            return b.attend(q, k, v, layer, ctx)
        self.checked.add(key)
        try:
            out = b.attend(q, k, v, layer, ctx)
        except BackendUnsupported:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of an unproven kernel: drop it
            return self._drop(b, f"{type(e).__name__}: {e}", ref.attend(q, k, v, layer, ctx))
        expected = ref.attend(q, k, v, layer, ctx)  # rewrites the same K/V
        why = mismatch(out, expected, "output", f"{ref.name}'s")
        return out if why is None else self._drop(b, why, expected)

    def _drop(self, b: Any, why: str, out: Any) -> Any:
        log.warning("attention backend %s switched off: %s; %s serves instead", b.name, why,
                    self.backends[-1].name)
        self.dropped[b.name] = why
        self.backends = [x for x in self.backends if x is not b]
        return out


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
