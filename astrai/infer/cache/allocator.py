"""Page allocator with reference counts (docs/engine.md).

A page is `page_size` consecutive token slots (slots p*P .. p*P+P-1). In contiguous mode a
page is a whole request row (P = max_context), so one allocation per request covers its
context. Every holder of a page — a request using it, the radix cache remembering it —
owns one reference; a page returns to the free list when its count reaches zero.

Pages the radix cache holds and no request uses (count 1, `cached`) are evictable: the
cache evicts them in LRU order when the free list runs short (`RadixCache.evict`).
"""

from __future__ import annotations


class PageAllocator:
    def __init__(self, num_pages: int, page_size: int) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.ref = [0] * num_pages
        self.cached = [False] * num_pages
        """True while the radix cache holds a reference to the page."""
        self._free = list(range(num_pages - 1, -1, -1))  # stack: page 0 first
        self._evictable = 0
        """Pages held only by the cache (ref == 1 and cached)."""

    # -- counts ----------------------------------------------------------------------------
    def num_free(self) -> int:
        return len(self._free)

    def num_evictable(self) -> int:
        return self._evictable

    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    # -- verbs -----------------------------------------------------------------------------
    def alloc(self, n: int) -> list[int] | None:
        """n fresh pages with one reference each, or None (all or nothing)."""
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self.ref[p] = 1
        return pages

    def incref(self, pages: list[int]) -> None:
        for p in pages:
            if self.ref[p] <= 0:
                raise RuntimeError(f"incref of free page {p}")
            if self.cached[p] and self.ref[p] == 1:
                self._evictable -= 1
            self.ref[p] += 1

    def decref(self, pages: list[int]) -> None:
        for p in pages:
            r = self.ref[p] - 1
            if r < 0:
                raise RuntimeError(f"decref of free page {p}")
            self.ref[p] = r
            if r == 0:
                if self.cached[p]:  # the cache's reference is dropped by uncache() only
                    raise RuntimeError(f"decref dropped the cache's reference to page {p}")
                self._free.append(p)
            elif r == 1 and self.cached[p]:
                self._evictable += 1

    def mark_cached(self, page: int) -> None:
        """The radix cache takes a reference to `page`."""
        if self.cached[page]:
            raise RuntimeError(f"page {page} is already cached")
        self.incref([page])  # the caller (a request) holds one already, so ref >= 2 here
        self.cached[page] = True

    def uncache(self, page: int) -> None:
        """The radix cache drops its reference to `page` (eviction)."""
        if not self.cached[page]:
            raise RuntimeError(f"page {page} is not cached")
        if self.ref[page] == 1:
            self._evictable -= 1
        self.cached[page] = False
        self.ref[page] -= 1
        if self.ref[page] == 0:
            self._free.append(page)
