"""Thresholds of the weight inspection, each documented and settable from the CLI.

The verdict (docs/inspect-weights.md):
  found      — a matrix holds a locked value, or any tensor holds non-finite entries or
               entries with |w| > overflow;
  suspected  — nothing found, but a token row's norm is extreme, a matrix is dominated by one
               non-zero value; in a bf16 run written round-to-nearest, too many next updates
               round away or the norm gains never left 1.0; or (given two or more
               checkpoints) more entries stayed bit-identical than an unbiased rounding
               explains;
  healthy    — none of these. 1-D gains never trip the verdict by their locked values.
"""

from __future__ import annotations

from pydantic import Field

from astrai.typed_config import TypedConfig


class InspectConfig(TypedConfig):
    """What counts as locked, overflowed, extreme or stuck."""

    unknown_key_hint = "see docs/inspect-weights.md"

    lock_min_count: int = Field(16, ge=2)
    """A value must recur at least this many times in one tensor to count as locked."""
    lock_min_z: float = Field(8.0, gt=0)
    """...and lie at least this many robust std (1.4826 * MAD) away from the tensor's median."""
    lock_excess: float = Field(10.0, ge=1)
    """...and recur this many times more often than the tensor's spread explains (the larger
    of a normal fit and the density of neighbouring values)."""
    overflow: float = Field(1e4, gt=0)
    """Entries with |w| above this are overflowed (the paper's embeddings reached ~2e37)."""
    row_norm_factor: float = Field(50.0, gt=1)
    """A token row (embedding or LM head) whose L2 norm exceeds this times the median row norm
    is extreme."""
    stuck_min_count: int = Field(16, ge=1)
    """Given several checkpoints, this many bit-identical entries in moving matrices make the
    verdict 'suspected'."""
    stuck_excess: float = Field(1.5, ge=1)
    """Given several checkpoints with optimizer state, stuck entries must exceed this many
    times the count an unbiased rounding leaves unchanged (plus 4 binomial standard
    deviations) to count."""
    rounds_away_max: float = Field(0.25, gt=0, le=1)
    """A bf16 checkpoint written round-to-nearest is suspect when at least this share of its
    next updates is under half an ulp (they are lost)."""
    frozen_gain_share: float = Field(0.9, gt=0, le=1)
    """...or when, past step 0, at least this share of a kind of norm gains is still exactly
    1.0, their init value."""
    stuck_min_moved: float = Field(0.5, ge=0, le=1)
    """A tensor is 'moving' when at least this fraction of its entries changed between the
    checkpoints; only moving tensors have stuck entries."""
    lr: float | None = Field(None, gt=0)
    """Learning rate for the BF16 dead-zone figure; None reads it from meta.json."""
    dead_zone_lrs: tuple[float, ...] = (1e-3, 1e-4, 1e-5, 1e-6)
    """Learning rates at which the dead-zone fraction is always reported."""
    top: int = Field(10, ge=1)
    """How many offenders (tensors and single entries) to list."""
    chunk_elements: int = Field(1 << 22, ge=1024)
    """Elements read at once; bounds memory (a tensor is never loaded whole)."""
    max_candidates: int = Field(32, ge=1)
    """Locked values located and reported per tensor (most frequent first)."""

    @classmethod
    def build(cls, **kwargs) -> InspectConfig:
        """Validate options; a bad one is a ConfigError naming the field."""
        options = {k: v for k, v in kwargs.items() if v is not None}
        return cls.from_dict(options, source="inspect-weights")
