"""Inference: a paged-KV, continuous-batching engine with radix prefix sharing.

Public API: `Engine`, `SamplingParams`, `CacheConfig`, `SchedulerConfig`, `RequestOutput`,
and the attention-backend selection `attn_backend` (see docs/engine.md).
"""

from astrai.infer.backends.registry import attn_backend, backend_status, select_backend
from astrai.infer.config import CacheConfig, SchedulerConfig
from astrai.infer.engine import Engine
from astrai.infer.metrics import EngineStats, StepInfo
from astrai.infer.params import SamplingParams
from astrai.infer.request import RequestMetrics, RequestOutput, Usage

__all__ = [
    "CacheConfig", "Engine", "EngineStats", "RequestMetrics", "RequestOutput",
    "SamplingParams", "SchedulerConfig", "StepInfo", "Usage", "attn_backend",
    "backend_status", "select_backend",
]
