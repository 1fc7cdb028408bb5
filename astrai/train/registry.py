"""Name -> class tables whose entries may be lazy "module:Class" paths.

Lazy entries let later rooms add an executor or strategy with one line in a table, without
import-time registration side effects and without importing torch.distributed (or a
rollout engine) for runs that do not use it.
"""

from __future__ import annotations

import importlib
from typing import Generic, TypeVar

from astrai.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, what: str, entries: dict[str, type[T] | str]) -> None:
        self.what, self.entries = what, dict(entries)

    def register(self, name: str, entry: type[T] | str) -> None:
        self.entries[name] = entry

    def names(self) -> list[str]:
        return list(self.entries)

    def available(self) -> list[str]:
        """Names whose module imports (a lazy entry whose module is absent is skipped)."""
        out = []
        for name in self.entries:
            try:
                self.get(name)
            except ConfigError:
                continue
            out.append(name)
        return out

    def get(self, name: str) -> type[T]:
        entry = self.entries.get(name)
        if entry is None:
            raise ConfigError(
                f"{self.what}: unknown '{name}'; choose one of {', '.join(self.available())}"
            )
        if isinstance(entry, str):
            module, _, attr = entry.partition(":")
            try:
                entry = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError):
                raise ConfigError(
                    f"{self.what}: '{name}' is not available in this installation ({module})"
                ) from None
        return entry
