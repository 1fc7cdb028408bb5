"""The KV cache: flat buffers, the request->slot table, pages, prefix sharing, the step record."""

from astrai.infer.cache.allocator import PageAllocator
from astrai.infer.cache.pool import KVHandle, PagePool, PoolStats
from astrai.infer.cache.radix import RadixCache
from astrai.infer.cache.record import KVCache, build_kv_cache
from astrai.infer.cache.req_to_token import ReqToTokenPool
from astrai.infer.cache.storage import KVStorage

__all__ = [
    "KVCache", "KVHandle", "KVStorage", "PageAllocator", "PagePool", "PoolStats",
    "RadixCache", "ReqToTokenPool", "build_kv_cache",
]
