"""Typed configs of the inference engine: the KV cache and the scheduler.

Validation raises `ConfigError` naming the field and the fix (docs/architecture.md: "User mistakes raise an AstraiError").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from astrai.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class CacheConfig:
    """Shape and policy of the KV pool (docs/engine.md)."""

    mode: Literal["paged", "contiguous"] = "paged"
    """paged: slots handed out page by page on demand (radix sharing possible);
    contiguous: every request row owns max_context slots (req_to_token is linear)."""
    page_size: int = 16
    """Token slots per page (paged mode); the unit of allocation and of prefix sharing."""
    max_kv_tokens: int = 32768
    """Token slots in the pool (paged mode); rounded down to whole pages."""
    max_requests: int = 64
    """Rows of req_to_token: requests that may hold KV at once."""
    max_context: int | None = None
    """Longest sequence (prompt + output) a request may reach; None = model max_seq_len."""
    radix: bool = True
    """Share complete prefix pages between requests through the radix cache (paged only)."""
    dtype: str | None = None
    """KV dtype: float32 | bfloat16 | float16; None = the model's dtype."""

    def validate(self, model_max_len: int) -> None:
        if self.mode not in ("paged", "contiguous"):
            raise ConfigError(f"cache mode '{self.mode}': use 'paged' or 'contiguous'")
        if self.page_size < 1:
            raise ConfigError(f"cache page_size={self.page_size}: must be >= 1")
        if self.max_requests < 1:
            raise ConfigError(f"cache max_requests={self.max_requests}: must be >= 1")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ConfigError(f"cache dtype '{self.dtype}': use one of {', '.join(DTYPES)}")
        ctx = self.context_len(model_max_len)
        if ctx < 2:
            raise ConfigError(f"cache max_context={ctx}: must be >= 2")
        if self.mode == "paged" and self.num_pages() * self.page_size < ctx:
            raise ConfigError(
                f"cache max_kv_tokens={self.max_kv_tokens} holds fewer than max_context={ctx} "
                "tokens: raise max_kv_tokens or lower max_context"
            )

    def context_len(self, model_max_len: int) -> int:
        """The effective max_context: never beyond the model's RoPE table."""
        if self.max_context is None:
            return model_max_len
        if self.max_context > model_max_len:
            raise ConfigError(
                f"cache max_context={self.max_context} exceeds the model's max_seq_len="
                f"{model_max_len}: lower max_context"
            )
        return self.max_context

    def num_pages(self) -> int:
        return self.max_kv_tokens // self.page_size

    def torch_dtype(self, default: torch.dtype) -> torch.dtype:
        return default if self.dtype is None else DTYPES[self.dtype]


@dataclass
class SchedulerConfig:
    """Continuous-batching policy (vLLM v1 style: decodes first, then prefill chunks)."""

    max_step_tokens: int = 2048
    """Token budget of one step; a longer prompt is prefilled in chunks of what remains."""
    max_running: int | None = None
    """Requests decoding at once; None = cache max_requests."""
    watermark: float = 0.01
    """Fraction of pages kept free when admitting new requests (fewer preemptions)."""
    prompt_overflow: Literal["error", "truncate"] = "error"
    """A prompt longer than the context: fail, or keep its last tokens with a warning."""

    def validate(self) -> None:
        if self.max_step_tokens < 1:
            raise ConfigError(f"scheduler max_step_tokens={self.max_step_tokens}: must be >= 1")
        if self.max_running is not None and self.max_running < 1:
            raise ConfigError(f"scheduler max_running={self.max_running}: must be >= 1")
        if not 0.0 <= self.watermark < 1.0:
            raise ConfigError(f"scheduler watermark={self.watermark}: must be in [0, 1)")
        if self.prompt_overflow not in ("error", "truncate"):
            raise ConfigError(
                f"scheduler prompt_overflow='{self.prompt_overflow}': use 'error' or 'truncate'"
            )
