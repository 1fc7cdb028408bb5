"""The stored responses of `POST /v1/responses` (`store: true`, the default): what
`GET /v1/responses/{id}` returns and what `previous_response_id` continues.

In memory, bounded in three ways (docs/serve.md#limits), so that no client can grow the
server's memory by storing: at most `max_responses` entries and `max_bytes` bytes (each
entry counted as the UTF-8 JSON of its response object and its conversation), the oldest
evicted first; and each entry expires `ttl` seconds after it was stored. An entry larger
than `max_bytes` on its own is not stored (its response says `"store": false`). The
store is shared by the event loop and the worker threads that read requests: a lock
guards it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from astrai.errors import ConfigError


@dataclass
class ResponseStoreConfig:
    """The bounds of the stored responses."""

    max_responses: int = 1000
    """Responses kept at most; the oldest is evicted for a new one."""
    max_bytes: int = 64 * 1024 * 1024
    """Bytes kept at most (the JSON of each response and its conversation)."""
    ttl: float = 3600.0
    """Seconds a response stays retrievable after it was stored."""

    def validate(self) -> None:
        if self.max_responses < 0:
            raise ConfigError(f"--response-store-max {self.max_responses}: must be >= 0 "
                              "(0 stores nothing)")
        if self.max_bytes < 0:
            raise ConfigError(f"--response-store-bytes {self.max_bytes}: must be >= 0")
        if not self.ttl > 0:  # NaN included
            raise ConfigError(f"--response-store-ttl {self.ttl}: must be > 0 seconds")


@dataclass(frozen=True)
class Stored:
    """One stored response."""

    response: dict
    """The response object, as GET returns it."""
    conversation: list[dict]
    """The chat messages a continuation starts from: the input (with what it continued,
    without its instructions) and the response's output."""
    size: int
    at: float


def entry_size(response: dict, conversation: list[dict]) -> int:
    text = json.dumps([response, conversation], ensure_ascii=False)
    return len(text.encode("utf-8", "surrogatepass"))


class ResponseStore:
    def __init__(self, config: ResponseStoreConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or ResponseStoreConfig()
        self.clock = clock
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._items)

    @property
    def bytes(self) -> int:
        return self._bytes

    def fits(self, size: int) -> bool:
        """Whether an entry of `size` bytes can be stored at all."""
        return self.config.max_responses > 0 and size <= self.config.max_bytes

    def put(self, rid: str, response: dict, conversation: list[dict]) -> bool:
        """Store a response (evicting the oldest to make room); False when it cannot fit."""
        size = entry_size(response, conversation)
        if not self.fits(size):
            return False
        with self._lock:
            self._expire()
            self._pop(rid)
            self._items[rid] = Stored(response, conversation, size, self.clock())
            self._bytes += size
            while (len(self._items) > self.config.max_responses
                   or self._bytes > self.config.max_bytes):
                self._pop(next(iter(self._items)))
        return True

    def get(self, rid: str) -> Stored | None:
        with self._lock:
            self._expire()
            return self._items.get(rid)

    def delete(self, rid: str) -> bool:
        with self._lock:
            self._expire()
            return self._pop(rid)

    def _pop(self, rid: str) -> bool:
        item = self._items.pop(rid, None)
        if item is None:
            return False
        self._bytes -= item.size
        return True

    def _expire(self) -> None:
        """Drop the entries older than ttl (the oldest are first: entries are appended)."""
        limit = self.clock() - self.config.ttl
        while self._items:
            rid, item = next(iter(self._items.items()))
            if item.at > limit:
                return
            self._pop(rid)
