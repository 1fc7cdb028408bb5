"""PagePool: KVStorage + ReqToTokenPool + PageAllocator + RadixCache behind request verbs.

Each request holds a `KVHandle` (its req_to_token row and its pages, in position order:
position p lives in slot pages[p // P] * P + p % P). The verbs come in pairs, as in
nano-vllm's block manager: `open / close`, `reserve`, `cache`.

Contiguous mode: a page is a whole row (P = max_context) and row r's slots are
r * C .. r * C + C - 1, so req_to_token is the linear map and one page per request covers
its whole context — no on-demand allocation, no sharing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from astrai.infer.cache.allocator import PageAllocator
from astrai.infer.cache.radix import RadixCache
from astrai.infer.cache.req_to_token import ReqToTokenPool
from astrai.infer.cache.storage import KVStorage
from astrai.infer.config import CacheConfig


@dataclass
class KVHandle:
    """One request's hold on the pool."""

    row: int
    """Its row of req_to_token."""
    pages: list[int] = field(default_factory=list)
    """Pages covering positions [0, len(pages) * P), in position order."""
    cached_len: int = 0
    """Leading tokens whose K/V came from the prefix cache (no compute needed)."""
    salt: str | None = None
    """The prefix-cache key of the request's LoRA adapter (None: the base)."""


@dataclass
class PoolStats:
    """Counters for serving metrics (prefix hit rate, pool utilization)."""

    num_pages: int
    page_size: int
    used_pages: int
    """Pages with at least one holder (requests or the cache)."""
    cached_pages: int
    """Pages the radix cache remembers (some may also be in use)."""
    evictable_pages: int
    """Pages only the cache holds: reclaimable on demand."""
    prefix_query_tokens: int
    """Prompt tokens looked up in the prefix cache at first admission."""
    prefix_hit_tokens: int
    """Of those, tokens served from the cache."""

    @property
    def utilization(self) -> float:
        """Fraction of pages held by running requests (cache-only pages count as free)."""
        return (self.used_pages - self.evictable_pages) / max(self.num_pages, 1)

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0


class PagePool:
    def __init__(self, config: CacheConfig, *, n_layers: int, n_kv_heads: int, head_dim: int,
                 max_context: int, dtype: torch.dtype, device: torch.device | str) -> None:
        self.config = config
        self.max_context = C = max_context
        R = config.max_requests
        self.contiguous = config.mode == "contiguous"
        if self.contiguous:
            self.page_size, num_pages = C, R
        else:
            self.page_size, num_pages = config.page_size, config.num_pages()
        # paged mode keeps one page past the allocator's: the scratch page the static
        # decode step's padding rows write into (astrai.infer.decode_step)
        extra = 0 if self.contiguous else 1
        self.storage = KVStorage(n_layers, (num_pages + extra) * self.page_size, n_kv_heads,
                                 head_dim, dtype, device)
        self.scratch_slot: int | None = None if self.contiguous else num_pages * self.page_size
        """A slot no request owns (paged mode), or None."""
        self.req_to_token = ReqToTokenPool(R, C, device, linear=self.contiguous)
        self.allocator = PageAllocator(num_pages, self.page_size)
        self.radix = (RadixCache(self.allocator, self.page_size)
                      if config.radix and not self.contiguous else None)
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    @property
    def num_pages(self) -> int:
        return self.allocator.num_pages

    def pages_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.page_size)

    def available_pages(self) -> int:
        """Free pages plus those the cache could give back."""
        return self.allocator.num_free() + self.allocator.num_evictable()

    # -- request verbs ---------------------------------------------------------------------
    def open(self, tokens: Sequence[int], count_hits: bool = True,
             salt: str | None = None) -> KVHandle | None:
        """A row for a request about to prefill `tokens`, with its longest cached prefix
        under `salt` (its LoRA adapter's key) locked (at most len(tokens) - 1 tokens: the
        last one must be computed to get logits). None when no row is free."""
        if self.contiguous:
            pages = self.allocator.alloc(1)
            return None if pages is None else KVHandle(row=pages[0], pages=pages)
        row = self.req_to_token.alloc()
        if row is None:
            return None
        handle = KVHandle(row=row, salt=salt)
        if self.radix is not None and len(tokens) > 1:
            pages = self.radix.match(tokens[: len(tokens) - 1], salt=salt)
            if pages:
                self.allocator.incref(pages)
                self.req_to_token.write_pages(row, 0, pages, self.page_size)
                handle.pages = list(pages)
                handle.cached_len = len(pages) * self.page_size
        if count_hits:
            self.prefix_query_tokens += len(tokens)
            self.prefix_hit_tokens += handle.cached_len
        return handle

    def reserve(self, handle: KVHandle, n_tokens: int) -> bool:
        """Make positions [0, n_tokens) of the request addressable, evicting cached pages
        if the free list is short; False (nothing changed) when the pool cannot."""
        if n_tokens > self.max_context:
            return False
        need = self.pages_for(n_tokens) - len(handle.pages)
        if need <= 0:
            return True
        short = need - self.allocator.num_free()
        if short > 0 and self.radix is not None:
            self.radix.evict(short)
        pages = self.allocator.alloc(need)
        if pages is None:
            return False
        self.req_to_token.write_pages(handle.row, len(handle.pages), pages, self.page_size)
        handle.pages.extend(pages)
        return True

    def trim(self, handle: KVHandle, n_tokens: int) -> None:
        """Release the pages past those positions [0, n_tokens) need (speculative decoding:
        the slots of rejected proposals). Those pages are the request's own: the radix
        cache only holds complete pages of computed tokens, which lie before n_tokens."""
        if self.contiguous:
            return
        keep = self.pages_for(n_tokens)
        if len(handle.pages) > keep:
            extra = handle.pages[keep:]
            del handle.pages[keep:]
            self.allocator.decref(extra[::-1])

    def cache(self, handle: KVHandle, tokens: Sequence[int]) -> None:
        """Offer the complete pages of `tokens` (those with K/V written) to the radix cache."""
        if self.radix is not None and tokens:
            self.radix.insert(tokens, handle.pages, handle.salt)

    def close(self, handle: KVHandle, tokens: Sequence[int] = ()) -> None:
        """Release the request's hold; its materialized `tokens` stay cached for reuse."""
        self.cache(handle, tokens)
        # free in reverse so the stack hands them out again in ascending order: a later
        # request then often gets consecutive pages (read in place by torch_native)
        self.allocator.decref(handle.pages[::-1])
        handle.pages = []
        if not self.contiguous:
            self.req_to_token.free(handle.row)

    def stats(self) -> PoolStats:
        a = self.allocator
        return PoolStats(
            num_pages=a.num_pages, page_size=self.page_size, used_pages=a.num_used(),
            cached_pages=self.radix.num_nodes if self.radix is not None else 0,
            evictable_pages=a.num_evictable(), prefix_query_tokens=self.prefix_query_tokens,
            prefix_hit_tokens=self.prefix_hit_tokens,
        )
