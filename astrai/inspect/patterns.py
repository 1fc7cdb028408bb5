"""Findings grouped across layers, as in the paper's Table 2 ("W_k rows 6-7 in layers 1-23").

One tensor at a time says little; lock-in shows as the *same* rows of the same parameter kind
locking in many layers (docs/bf16-lockin.md). A pattern gathers one
parameter kind and one locked value over every layer where it appears.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from astrai.inspect.ranges import IndexSet
from astrai.inspect.tensor import TensorStats


@dataclass
class Pattern:
    """One locked value in one parameter kind, over the layers where it appears."""

    kind: str
    """Compact parameter kind (`attn.k_proj`, `embed_tokens`, `lm_head`)."""
    role: str
    value: float
    count: int
    layers: IndexSet
    rows: IndexSet
    """Union of the affected rows over the layers."""
    cols: IndexSet
    same_rows: bool
    """Every layer has exactly the same affected rows."""
    tensors: list[str] = field(default_factory=list)

    def location(self) -> str:
        """`rows 6–7 (all columns)` / `row 1, cols 3164–4699`."""
        noun = "token" if self.role in ("embedding", "lm_head") else "row"
        where = self.rows.named(noun)
        if not self.same_rows:
            where += " (varies by layer)"
        return f"{where}, {self.cols.named('col')}"

    def describe(self) -> str:
        """`attn.k_proj: 1,024 entries at exactly 1.0, rows 6–7, cols 0–511 in layers 1–3`."""
        s = f"{self.kind}: {self.count:,} entries at exactly {fmt_value(self.value)}, "
        s += self.location()
        if self.layers.ranges:
            s += f" in {self.layers.named('layer')}"
        return s


@dataclass
class OverflowGroup:
    """Overflowed (|w| > threshold) or non-finite entries of one parameter kind."""

    kind: str
    role: str
    entries: int
    """Overflowed plus non-finite entries."""
    nonfinite: int
    layers: IndexSet
    rows: IndexSet
    """Affected rows (token ids for embeddings and the LM head)."""
    absmax: float


@dataclass
class GainSummary:
    """1-D tensors (norm gains, biases) of one kind: summarised, never in the verdict."""

    kind: str
    tensors: int
    entries: int
    exact_one: int
    """Entries still exactly 1.0 — the RMSNorm init value."""
    min: float
    max: float
    locked: list[tuple[float, int]] = field(default_factory=list)
    """(value, count) of far-out values the lock detector flagged."""


def fmt_value(v: float) -> str:
    """`1.0`, `-0.5`, `2e+37`: short, and visibly a float."""
    s = f"{v:.7g}"
    return s + ".0" if s.lstrip("-").isdigit() else s


def locked_patterns(stats: list[TensorStats], *, gains: bool = False) -> list[Pattern]:
    """Group locked values by (parameter kind, value); matrices (default) or 1-D gains."""
    groups: dict[tuple[str, float], list[tuple[TensorStats, object]]] = {}
    for st in stats:
        if (st.param.role == "gain") != gains:
            continue
        for lv in st.locked:
            groups.setdefault((st.param.kind, lv.value), []).append((st, lv))
    out = []
    for (_, value), members in groups.items():
        rows, cols = IndexSet(), IndexSet()
        for _, lv in members:
            rows, cols = rows.union(lv.rows), cols.union(lv.cols)
        first = members[0][1].rows.ranges
        out.append(Pattern(
            kind=members[0][0].param.short, role=members[0][0].param.role, value=value,
            count=sum(lv.count for _, lv in members),
            layers=IndexSet.from_indices(
                st.param.layer for st, _ in members if st.param.layer is not None),
            rows=rows, cols=cols,
            same_rows=all(lv.rows.ranges == first for _, lv in members),
            tensors=[st.name for st, _ in members],
        ))
    return sorted(out, key=lambda p: (-p.count, p.kind, p.value))


def overflow_groups(stats: list[TensorStats]) -> list[OverflowGroup]:
    """Overflow and non-finite entries grouped by parameter kind."""
    groups: dict[str, list[TensorStats]] = {}
    for st in stats:
        if st.overflow or st.nonfinite:
            groups.setdefault(st.param.kind, []).append(st)
    out = []
    for members in groups.values():
        rows = IndexSet()
        for st in members:
            rows = rows.union(st.bad_rows)
        out.append(OverflowGroup(
            kind=members[0].param.short, role=members[0].param.role,
            entries=sum(st.overflow + st.nonfinite for st in members),
            nonfinite=sum(st.nonfinite for st in members),
            layers=IndexSet.from_indices(
                st.param.layer for st in members if st.param.layer is not None),
            rows=rows,
            absmax=max((st.absmax for st in members if math.isfinite(st.absmax)),
                       default=math.nan),
        ))
    return sorted(out, key=lambda g: -g.entries)


def gain_summaries(stats: list[TensorStats]) -> list[GainSummary]:
    groups: dict[str, list[TensorStats]] = {}
    for st in stats:
        if st.param.role == "gain" and st.skipped is None:
            groups.setdefault(st.param.kind, []).append(st)
    out = []
    for members in groups.values():
        locked: dict[float, int] = {}
        for st in members:
            for lv in st.locked:
                locked[lv.value] = locked.get(lv.value, 0) + lv.count
        fin = [st for st in members if math.isfinite(st.min)]
        out.append(GainSummary(
            kind=members[0].param.short, tensors=len(members),
            entries=sum(st.numel for st in members),
            exact_one=sum(st.exact_one for st in members),
            min=min((st.min for st in fin), default=math.nan),
            max=max((st.max for st in fin), default=math.nan),
            locked=sorted(locked.items(), key=lambda kv: -kv[1]),
        ))
    return out
