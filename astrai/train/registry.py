"""Name -> class tables a user picks from by name (--strategy, --parallel, --schedule).

Entries may be lazy "module:Class" paths, so choosing `none` never imports torch.distributed
and choosing `seq` never imports a rollout engine. Every class built from a table rejects
options it does not take through `reject_unknown`, so a misspelt key fails the same way
whichever table it went to.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from astrai.errors import ConfigError

T = TypeVar("T")


def reject_unknown(what: str, name: str, options: Mapping[str, Any]) -> None:
    """ConfigError naming the options a table entry does not take (nothing when empty)."""
    if options:
        raise ConfigError(f"{what} '{name}': unknown option(s) {', '.join(sorted(options))}")


class Registry(Generic[T]):
    def __init__(self, what: str, entries: dict[str, type[T] | str]) -> None:
        self.what, self.entries = what, dict(entries)

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
