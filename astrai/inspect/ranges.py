"""Index sets as compact ranges: rows 6-7, cols 3164-4699, layers 1-23, tokens 0-7."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class IndexSet:
    """Sorted indices (rows, columns, layers, token ids) stored as inclusive ranges."""

    ranges: list[tuple[int, int]] = field(default_factory=list)
    """Inclusive [first, last] runs of consecutive indices, ascending."""

    @classmethod
    def from_indices(cls, idx) -> IndexSet:
        vals = sorted({int(i) for i in idx})
        out: list[tuple[int, int]] = []
        for v in vals:
            if out and v == out[-1][1] + 1:
                out[-1] = (out[-1][0], v)
            else:
                out.append((v, v))
        return cls(out)

    @classmethod
    def from_counts(cls, counts: torch.Tensor) -> IndexSet:
        """The indices i where counts[i] > 0."""
        return cls.from_indices(torch.nonzero(counts > 0).flatten().tolist())

    def __len__(self) -> int:
        return sum(b - a + 1 for a, b in self.ranges)

    def __iter__(self):
        for a, b in self.ranges:
            yield from range(a, b + 1)

    def union(self, other: IndexSet) -> IndexSet:
        return IndexSet.from_indices(list(self) + list(other))

    def format(self, max_ranges: int = 6) -> str:
        """`6–7, 12, 40–41` (an en dash; `…` and the count beyond max_ranges)."""
        if not self.ranges:
            return "—"
        parts = [f"{a}" if a == b else f"{a}–{b}" for a, b in self.ranges[:max_ranges]]
        rest = len(self.ranges) - max_ranges
        if rest > 0:
            parts.append(f"… (+{rest} runs)")
        return ", ".join(parts)

    def named(self, noun: str, plural: str | None = None, max_ranges: int = 6) -> str:
        """`row 5`, `rows 6–7`, `layers 1–23`."""
        many = len(self.ranges) > 1 or any(a != b for a, b in self.ranges)
        return f"{(plural or noun + 's') if many else noun} {self.format(max_ranges)}"

    def to_json(self, max_ranges: int = 256) -> list[list[int]]:
        return [[a, b] for a, b in self.ranges[:max_ranges]]
