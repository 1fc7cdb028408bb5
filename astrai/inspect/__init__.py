"""Checkpoint numerics: BF16 lock-in, overflow, the ULP dead zone, stuck weights, residual
variance (docs/bf16-lockin.md).

    inspect_weights(paths, InspectConfig(...)) -> InspectReport      `astrai inspect-weights`
    residual_variance(preset_or_checkpoint) -> VarianceReport        `... --variance`
    check_lockin(model.named_parameters()) -> LockInCheck            live parameters
    LockInGuard(GuardConfig(...))                                     training callback
"""

from astrai.inspect.bf16 import (
    clipped_spike,
    dead_zone_mask,
    dead_zone_threshold,
    ulp,
    update_to_ulp_ratio,
)
from astrai.inspect.config import InspectConfig
from astrai.inspect.guard import GuardConfig, LockInCheck, LockInGuard, check_lockin, grad_norms
from astrai.inspect.report import InspectReport, inspect_weights
from astrai.inspect.variance import VarianceReport, block_variance, residual_variance

__all__ = [
    "GuardConfig", "InspectConfig", "InspectReport", "LockInCheck", "LockInGuard",
    "VarianceReport", "block_variance", "check_lockin", "clipped_spike", "dead_zone_mask",
    "dead_zone_threshold", "grad_norms", "inspect_weights", "residual_variance", "ulp",
    "update_to_ulp_ratio",
]
