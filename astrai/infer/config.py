"""Typed configs of the inference engine: the KV cache, the scheduler, speculative decoding.

Each is `TypedConfig`s (docs/architecture.md "Configs"): a bad value is a ConfigError naming
the field when the config is built; `CacheConfig.check` adds what depends on the model.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator

from astrai.errors import ConfigError
from astrai.typed_config import TypedConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CacheConfig(TypedConfig):
    """Shape and policy of the KV pool (docs/engine.md)."""

    config_name = "cache"

    mode: Literal["paged", "contiguous"] = "paged"
    """paged: slots handed out page by page on demand (radix sharing possible);
    contiguous: every request row owns max_context slots (req_to_token is linear)."""
    page_size: int = Field(16, ge=1)
    """Token slots per page (paged mode); the unit of allocation and of prefix sharing."""
    max_kv_tokens: int = Field(32768, ge=1)
    """Token slots in the pool (paged mode); rounded down to whole pages."""
    max_requests: int = Field(64, ge=1)
    """Rows of req_to_token: requests that may hold KV at once."""
    max_context: int | None = Field(None, ge=2)
    """Longest sequence (prompt + output) a request may reach; None = model max_seq_len."""
    radix: bool = True
    """Share complete prefix pages between requests through the radix cache (paged only)."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """KV dtype; None = the model's dtype."""

    def check(self, model_max_len: int) -> None:
        """What depends on the model: the context fits its RoPE table, the pool one context."""
        ctx = self.context_len(model_max_len)
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


class SchedulerConfig(TypedConfig):
    """Continuous-batching policy (vLLM v1 style: decodes first, then prefill chunks)."""

    config_name = "scheduler"

    max_step_tokens: int = Field(2048, ge=1)
    """Token budget of one step; a longer prompt is prefilled in chunks of what remains."""
    max_running: int | None = Field(None, ge=1)
    """Requests decoding at once; None = cache max_requests."""
    watermark: float = Field(0.01, ge=0, lt=1)
    """Fraction of pages kept free when admitting new requests (fewer preemptions)."""
    prompt_overflow: Literal["error", "truncate"] = "error"
    """A prompt longer than the context: fail, or keep its last tokens with a warning."""


class SpeculativeConfig(TypedConfig):
    """Speculative decoding (docs/engine.md "Speculative decoding"): each decoding request
    proposes up to `num_speculative_tokens` tokens that one forward of the model verifies."""

    config_name = "speculative"

    method: Literal["ngram", "draft"] = "ngram"
    """ngram: prompt lookup, the continuation of the longest recent n-gram match among the
    request's own tokens; draft: a smaller model sharing the tokenizer proposes."""
    num_speculative_tokens: int = Field(4, ge=1, le=64)
    """Tokens proposed per request and step (k: one step emits up to k + 1)."""
    prompt_lookup_max: int = Field(4, ge=1)
    """Longest n-gram matched (ngram)."""
    prompt_lookup_min: int = Field(1, ge=1)
    """Shortest n-gram matched (ngram); no match this long: no proposal that step."""
    model: str | None = None
    """The draft model's directory (draft; `Engine(draft_model=...)` may give the module)."""

    @model_validator(mode="after")
    def _check_lookup(self) -> SpeculativeConfig:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min={self.prompt_lookup_min} exceeds "
                             f"prompt_lookup_max={self.prompt_lookup_max}")
        if self.method == "ngram" and self.model is not None:
            raise ValueError("a draft model is given with method 'ngram': use method 'draft'")
        return self
