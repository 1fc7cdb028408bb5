"""RadixCache: exact, page-aligned prefix sharing (docs/engine.md).

A trie whose every edge is exactly one page of token ids (SGLang's radix tree at page
granularity). Walking edges from the root keeps the parent-prefix context: a page is found
only under the very prefix it was computed with, never by a global hash of its tokens.

Only complete pages whose K/V are materialized are inserted; the final sampled token of a
request has no K/V yet, so callers pass `tokens[:num_computed]`. The cache holds one
reference on each page it remembers; pages nobody else uses are evicted leaf-first in LRU
order when the allocator runs short.

A `salt` (a LoRA adapter's key) joins the first page's key: prefixes computed under one
adapter live in their own subtree, found only with the same salt — never by the base or
another adapter.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from astrai.infer.cache.allocator import PageAllocator


class _Node:
    __slots__ = ("children", "key", "last_access", "page", "parent", "serial")

    def __init__(self, parent: _Node | None, key: tuple[int, ...], page: int,
                 serial: int) -> None:
        self.children: dict[tuple[int, ...], _Node] = {}
        self.parent = parent
        self.key = key
        self.page = page
        self.last_access = 0
        self.serial = serial


class RadixCache:
    def __init__(self, allocator: PageAllocator, page_size: int) -> None:
        self.allocator = allocator
        self.page_size = page_size
        self.root = _Node(None, (), -1, 0)
        self._clock = 0
        self._serial = 0
        self.num_nodes = 0

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _keys(self, tokens: Sequence[int], n_pages: int, salt: str | None = None):
        P = self.page_size
        for i in range(n_pages):
            key = tuple(tokens[i * P:(i + 1) * P])
            yield key if salt is None or i else (salt, *key)

    def match(self, tokens: Sequence[int], touch: bool = True,
              salt: str | None = None) -> list[int]:
        """Pages of the longest cached prefix of `tokens` (whole pages only) under `salt`.
        Touches the path for LRU unless `touch` is False; the caller increfs the pages it
        keeps."""
        node, pages = self.root, []
        now = self._tick() if touch else 0
        for key in self._keys(tokens, len(tokens) // self.page_size, salt):
            node = node.children.get(key)
            if node is None:
                break
            if touch:
                node.last_access = now
            pages.append(node.page)
        return pages

    def insert(self, tokens: Sequence[int], pages: Sequence[int],
               salt: str | None = None) -> int:
        """Remember the complete pages of `tokens` (whose K/V live in `pages`); returns the
        number of pages newly cached. Where a page of the same prefix is cached already
        (another request computed it first), the cached one is kept."""
        n = min(len(tokens) // self.page_size, len(pages))
        node, now, added = self.root, self._tick(), 0
        for i, key in enumerate(self._keys(tokens, n, salt)):
            child = node.children.get(key)
            if child is None:
                self._serial += 1
                child = _Node(node, key, pages[i], self._serial)
                node.children[key] = child
                self.allocator.mark_cached(pages[i])
                self.num_nodes += 1
                added += 1
            child.last_access = now
            node = child
        return added

    def _evictable(self, node: _Node) -> bool:
        return not node.children and self.allocator.ref[node.page] == 1

    def evict(self, n_pages: int) -> int:
        """Free up to `n_pages` pages held only by the cache, least recently used leaves
        first (a parent becomes a candidate once its children are gone)."""
        if n_pages <= 0:
            return 0
        heap = [(nd.last_access, nd.serial, nd) for nd in self._leaves() if self._evictable(nd)]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < n_pages:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            del parent.children[node.key]
            self.allocator.uncache(node.page)
            self.num_nodes -= 1
            freed += 1
            if parent is not self.root and self._evictable(parent):
                heapq.heappush(heap, (parent.last_access, parent.serial, parent))
        return freed

    def _leaves(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                yield node

    def clear(self) -> int:
        """Evict every page no request uses; returns how many were freed."""
        return self.evict(self.num_nodes)
