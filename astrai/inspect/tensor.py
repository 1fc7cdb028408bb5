"""Numerics of one tensor, read in row chunks: statistics, locked values, overflow, dead zone.

Locked values (seeds/paper-bf16-lockin.tex §Observation: weights "locked at exactly 1.0" in
the same rows) are entries sitting exactly on one value that
  * lies far outside the tensor's spread: |v - median| >= lock_min_z * 1.4826 * MAD, and
  * recurs far more often than that spread explains: count >= lock_min_count and
    count >= lock_excess * expected, where expected is the larger of a normal fit's count in
    v's rounding bin and the density of the entries around v (so a dense heavy tail in BF16,
    where far values legitimately repeat, is not mistaken for lock-in).
Healthy tensors take one pass (statistics); a second pass counts far-out values only when some
entry lies beyond the threshold, and a third locates the locked values only when there are any.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from astrai.inspect.bf16 import EXP_BINS, dead_zone_count, exponent_histogram, ulp
from astrai.inspect.config import InspectConfig
from astrai.inspect.names import ParamName
from astrai.inspect.ranges import IndexSet

RowReader = Callable[[int, int], torch.Tensor]
"""read(start, stop) -> rows [start, stop) as a [n, cols] tensor."""

_SAMPLE = 1 << 20  # entries sampled for the median / MAD
_MAX_FAR_VALUES = 1 << 22  # distinct far-out values kept per tensor before pruning singletons


@dataclass
class LockedValue:
    """Entries of one tensor sitting exactly on one far-out value."""

    value: float
    count: int
    z: float
    """Distance from the tensor's median in robust std."""
    expected: float
    """How many entries the tensor's spread would put on this exact value."""
    rows: IndexSet
    cols: IndexSet
    full_rows: int = 0
    """Rows in which every entry holds the value."""


@dataclass
class TensorStats:
    """Everything the inspection knows about one tensor."""

    name: str
    param: ParamName
    dtype: str
    shape: tuple[int, ...]
    numel: int
    nonfinite: int = 0
    mean: float = math.nan
    std: float = math.nan
    min: float = math.nan
    max: float = math.nan
    absmax: float = math.nan
    zeros: int = 0
    exact_one: int = 0
    """Entries exactly 1.0 (the paper's locked value; the init value of norm gains)."""
    center: float = math.nan
    """Median (from a strided sample of up to 2^20 entries)."""
    scale: float = math.nan
    """Robust std: 1.4826 * MAD, or the std when over half the entries share one value."""
    dominant: float | None = None
    """The value over half the entries hold, when it is not 0 (MAD = 0)."""
    overflow: int = 0
    """Finite entries with |w| above the overflow threshold."""
    bad_rows: IndexSet = field(default_factory=IndexSet)
    """Rows (token ids for embeddings) holding overflowed or non-finite entries."""
    bad_entries: int = 0
    extreme_rows: list[tuple[int, float]] = field(default_factory=list)
    """Token rows whose L2 norm is extreme: (row, norm)."""
    row_norm_median: float | None = None
    locked: list[LockedValue] = field(default_factory=list)
    top: list[tuple[tuple[int, int], float]] = field(default_factory=list)
    """Largest |w| entries: ((row, col), value)."""
    exp_hist: torch.Tensor | None = field(default=None, repr=False)
    """Entries per binade (bf16.exponent_histogram), for the dead zone at any lr."""
    skipped: str | None = None
    """Why the tensor was not analysed (integer or fp8 dtype, empty)."""

    @property
    def locked_count(self) -> int:
        return sum(lv.count for lv in self.locked)

    def dead_zone(self, lr: float) -> int:
        """Entries an update of size lr cannot move in BF16."""
        return 0 if self.exp_hist is None else dead_zone_count(self.exp_hist, lr)


class _Moments:
    """Chan et al. parallel mean / M2 merge in float64."""

    def __init__(self) -> None:
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    def add(self, x: torch.Tensor) -> None:
        n = x.numel()
        if not n:
            return
        xd = x.double()
        mu = float(xd.mean())
        m2 = float((xd - mu).square().sum())
        tot = self.n + n
        delta = mu - self.mean
        self.mean += delta * n / tot
        self.m2 += m2 + delta * delta * self.n * n / tot
        self.n = tot

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.n) if self.n else math.nan


def analyze_tensor(read: RowReader, param: ParamName, shape: tuple[int, ...],
                   dtype: torch.dtype, cfg: InspectConfig) -> TensorStats:
    """One tensor's TensorStats, reading it through `read` a chunk of rows at a time."""
    rows = shape[0] if shape else 1
    numel = math.prod(shape) if shape else 1
    cols = numel // rows if rows else 0
    st = TensorStats(param.name, param, str(dtype).removeprefix("torch."), tuple(shape), numel)
    if numel == 0:
        st.skipped = "empty"
        return st
    step = max(1, cfg.chunk_elements // max(cols, 1))
    chunks = [(a, min(a + step, rows)) for a in range(0, rows, step)]
    sample = _pass_stats(read, chunks, st, rows, cols, cfg)
    if st.nonfinite == numel:
        return st
    _robust_scale(st, sample)
    if math.isfinite(st.scale) and st.scale > 0:
        reach = cfg.lock_min_z * st.scale
        if st.min < st.center - reach or st.max > st.center + reach:
            uniq, cnt = _far_values(read, chunks, st, cfg)
            locked = _judge(st, uniq, cnt, cfg)
            if locked:
                _locate(read, chunks, st, locked, rows, cols)
    return st


def _pass_stats(read: RowReader, chunks, st: TensorStats, rows: int, cols: int,
                cfg: InspectConfig) -> torch.Tensor:
    """Moments, extremes, counts, exponent histogram, top entries; returns the sample."""
    mom = _Moments()
    lo, hi, amax = math.inf, -math.inf, 0.0
    stride = max(1, st.numel // _SAMPLE)
    samples, hist = [], None
    bad_rows = None
    row_norms = torch.zeros(rows, dtype=torch.float64) if st.param.by_token else None
    top_v: list[float] = []
    top_i: list[int] = []
    k = min(cfg.top, st.numel)
    for a, b in chunks:
        x = read(a, b)  # (n, cols)
        xf = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
        fin = torch.isfinite(xf)
        n_bad = int((~fin).sum())
        xv = xf[fin] if n_bad else xf.reshape(-1)
        st.nonfinite += n_bad
        mom.add(xv)
        if xv.numel():
            lo, hi = min(lo, float(xv.min())), max(hi, float(xv.max()))
            amax = max(amax, float(xv.abs().max()))
        st.zeros += int((xv == 0).sum())
        st.exact_one += int((xv == 1).sum())
        over = xf.abs() > cfg.overflow  # inf counts here too; split below
        st.overflow += int((over & fin).sum())
        bad = over | ~fin
        if n_bad or bool(over.any()):
            if bad_rows is None:
                bad_rows = torch.zeros(rows, dtype=torch.int64, device=x.device)
            bad_rows[a:b] += bad.sum(1)
        if row_norms is not None:
            row_norms[a:b] = torch.linalg.vector_norm(xf.double(), dim=1).cpu()
        flat = xf.reshape(-1)
        g0 = a * cols
        s = flat[(-g0) % stride::stride]
        samples.append(s[torch.isfinite(s)].double().cpu())
        h = exponent_histogram(xv).cpu()
        hist = h if hist is None else hist + h
        mag = flat.abs().nan_to_num(nan=-1.0)
        tv, ti = torch.topk(mag, min(k, mag.numel()))
        keep = tv >= 0  # NaN entries were mapped to -1
        top_v += flat[ti[keep]].tolist()
        top_i += (ti[keep] + g0).tolist()
    st.mean, st.std = mom.mean if mom.n else math.nan, mom.std
    st.min, st.max = (lo, hi) if mom.n else (math.nan, math.nan)
    st.absmax = amax if mom.n else math.nan
    st.exp_hist = hist if hist is not None else torch.zeros(EXP_BINS, dtype=torch.int64)
    if bad_rows is not None:
        st.bad_rows = IndexSet.from_counts(bad_rows.cpu())
        st.bad_entries = int(bad_rows.sum())
    if row_norms is not None:
        _extreme_rows(st, row_norms, cfg)
    order = sorted(range(len(top_v)), key=lambda i: -abs(top_v[i]))[:k]
    st.top = [((top_i[i] // cols, top_i[i] % cols), top_v[i]) for i in order]
    return torch.cat(samples) if samples else torch.zeros(0, dtype=torch.float64)


def _extreme_rows(st: TensorStats, norms: torch.Tensor, cfg: InspectConfig) -> None:
    fin = torch.isfinite(norms)
    if not bool(fin.any()):
        return
    med = float(norms[fin].median())
    st.row_norm_median = med
    extreme = ~fin | (norms > cfg.row_norm_factor * med) if med > 0 else ~fin
    if st.bad_rows.ranges:
        extreme[list(st.bad_rows)] = True
    idx = torch.nonzero(extreme).flatten().tolist()
    st.extreme_rows = [(i, float(norms[i])) for i in idx]


def _robust_scale(st: TensorStats, s: torch.Tensor) -> None:
    if not s.numel():
        return
    center = float(s.median())
    mad = float((s - center).abs().median())
    st.center = center
    if mad > 0:
        st.scale = 1.4826 * mad
        return
    # Over half the sampled entries share `center`: fall back to the std of the others.
    if center != 0 and st.param.role != "gain":
        st.dominant = center
    rest = s[s != center]
    st.scale = float(rest.std()) if rest.numel() > 1 else 0.0


def _far_values(read: RowReader, chunks, st: TensorStats,
                cfg: InspectConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct values (sorted) and their counts among entries beyond lock_min_z / 2 robust
    std — wide enough that every candidate's neighbourhood (below) is inside it."""
    lo = st.center - cfg.lock_min_z / 2 * st.scale
    hi = st.center + cfg.lock_min_z / 2 * st.scale
    uniq = torch.zeros(0, dtype=torch.float64)
    cnt = torch.zeros(0, dtype=torch.int64)
    for a, b in chunks:
        x = read(a, b)
        xf = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
        # Overflowed entries are reported as overflow, not as a locked value.
        keep = (xf.abs() <= cfg.overflow) & ((xf < lo) | (xf > hi))
        far = xf[keep].double().cpu()
        if not far.numel():
            continue
        u, c = torch.unique(far, return_counts=True)
        uniq, inv = torch.unique(torch.cat([uniq, u]), return_inverse=True)
        merged = torch.zeros(uniq.numel(), dtype=torch.int64)
        merged.index_add_(0, inv, torch.cat([cnt, c]))
        cnt = merged
        if uniq.numel() > _MAX_FAR_VALUES:  # a heavy fp32 tail: singletons cannot be lock-in
            keep1 = cnt > 1
            uniq, cnt = uniq[keep1], cnt[keep1]
    return uniq, cnt


def _judge(st: TensorStats, uniq: torch.Tensor, cnt: torch.Tensor,
           cfg: InspectConfig) -> list[tuple[float, int, float, float]]:
    """(value, count, z, expected) of the locked values, most frequent first.

    expected = max(normal fit's count in v's rounding bin, mean count per representable value
    among the entries within |v - median| / 8 of v), so values that repeat only because a
    dense tail rounds onto them (BF16) are not taken for lock-in."""
    z = (uniq - st.center) / st.scale
    sel = (cnt >= cfg.lock_min_count) & (z.abs() >= cfg.lock_min_z)
    if not bool(sel.any()):
        return []
    csum = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(cnt, 0)])
    n_fin = st.numel - st.nonfinite
    dtype = getattr(torch, st.dtype)
    out = []
    for j in torch.nonzero(sel).flatten().tolist():
        v, c, zj = float(uniq[j]), int(cnt[j]), float(z[j])
        half = abs(v - st.center) / 8
        lo = int(torch.searchsorted(uniq, v - half, side="left"))
        hi = int(torch.searchsorted(uniq, v + half, side="right"))
        neigh = int(csum[hi] - csum[lo]) - c
        width = float(ulp(v, dtype))
        local = neigh * width / (2 * half)
        gauss = n_fin * math.exp(-0.5 * zj * zj) / math.sqrt(2 * math.pi) / st.scale * width
        expected = max(gauss, local)
        if c >= cfg.lock_excess * expected:
            out.append((v, c, zj, expected))
    out.sort(key=lambda t: -t[1])
    return out[: cfg.max_candidates]


def _locate(read: RowReader, chunks, st: TensorStats,
            locked: list[tuple[float, int, float, float]], rows: int, cols: int) -> None:
    """Rows and columns of each locked value."""
    K = len(locked)
    row_c = torch.zeros(K, rows, dtype=torch.int64)
    col_c = torch.zeros(K, cols, dtype=torch.int64)
    for a, b in chunks:
        x = read(a, b)
        xf = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
        for j, (v, *_) in enumerate(locked):
            eq = xf == v
            if bool(eq.any()):
                row_c[j, a:b] += eq.sum(1).cpu()
                col_c[j] += eq.sum(0).cpu()
    for j, (v, count, z, expected) in enumerate(locked):
        st.locked.append(LockedValue(
            value=v, count=count, z=z, expected=expected,
            rows=IndexSet.from_counts(row_c[j]), cols=IndexSet.from_counts(col_c[j]),
            full_rows=int((row_c[j] == cols).sum()),
        ))
