"""Numerics of one tensor, read in row chunks: statistics, locked values, overflow, dead zone.

Locked values (docs/bf16-lockin.md: weights "locked at exactly 1.0" in
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

from astrai.inspect.bf16 import dead_zone_count, ulp
from astrai.inspect.chunks import Moments, Scratch
from astrai.inspect.config import InspectConfig
from astrai.inspect.names import ParamName
from astrai.inspect.ranges import IndexSet

RowReader = Callable[[int, int], torch.Tensor]
"""read(start, stop) -> rows [start, stop) as a [n, cols] tensor."""

_SAMPLE = 1 << 18  # entries sampled for the median / MAD
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
    """Median (from a strided sample of up to 2^18 entries)."""
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
    sc = Scratch(min(numel, step * max(cols, 1)), dtype)
    sample = _pass_stats(read, chunks, st, rows, cols, cfg, sc)
    if st.nonfinite == numel:
        return st
    _robust_scale(st, sample)
    if math.isfinite(st.scale) and st.scale > 0:
        reach = cfg.lock_min_z * st.scale
        if st.min < st.center - reach or st.max > st.center + reach:
            uniq, cnt = _far_values(read, chunks, st, cfg, sc)
            locked = _judge(st, uniq, cnt, cfg)
            if locked:
                _locate(read, chunks, st, locked, rows, cols, sc)
    return st


def _pass_stats(read: RowReader, chunks, st: TensorStats, rows: int, cols: int,
                cfg: InspectConfig, sc: Scratch) -> torch.Tensor:
    """Moments, extremes, counts, exponent histogram, top entries; returns the sample."""
    mom = Moments()
    lo, hi = math.inf, -math.inf
    stride = max(1, st.numel // _SAMPLE)
    samples: list[torch.Tensor] = []
    hist = None
    bad_rows = None
    row_norms = torch.zeros(rows, dtype=torch.float64) if st.param.by_token else None
    top_v: list[float] = []
    top_i: list[int] = []
    k = min(cfg.top, st.numel)
    for a, b in chunks:
        x = read(a, b)  # (n, cols) in the stored dtype
        h, n_bad = sc.exponent_census(x)  # inf/nan counted from the exponent bits
        hist = h if hist is None else hist + h
        xf = sc.as_float(x)
        fin = torch.isfinite(xf) if n_bad else None
        xv = xf[fin] if fin is not None else xf
        st.nonfinite += n_bad
        mom.add(xv, sc)
        if xv.numel():
            mn, mx = torch.aminmax(xv)
            lo, hi = min(lo, float(mn)), max(hi, float(mx))
        st.zeros += sc.count(torch.eq, xv, 0.0)
        st.exact_one += sc.count(torch.eq, xv, 1.0)
        ax = sc.like(sc.tmp, xf)
        torch.abs(xf, out=ax)  # (n, cols)
        if n_bad:
            ax.nan_to_num_(nan=-1.0, posinf=math.inf)
        n_over = sc.count(torch.gt, ax, cfg.overflow)  # inf included, split off below
        if n_bad:
            n_over -= int(torch.count_nonzero(torch.isinf(xf)))
        st.overflow += n_over
        if n_bad or n_over:
            if bad_rows is None:
                bad_rows = torch.zeros(rows, dtype=torch.int64, device=x.device)
            bad = (ax > cfg.overflow) | ~fin if fin is not None else ax > cfg.overflow
            bad_rows[a:b] += bad.sum(1)
        # Top |w|: the k largest entries lie in the k rows with the largest row maxima.
        top_rows = torch.topk(ax.amax(dim=1), min(k, ax.shape[0])).indices  # (k,)
        sub = ax[top_rows].reshape(-1)  # (k * cols,)
        tv, ti = torch.topk(sub, min(k, sub.numel()))
        keep = tv >= 0  # NaN entries were mapped to -1
        r, c = top_rows[ti[keep] // cols], ti[keep] % cols
        top_v += xf[r, c].tolist()
        top_i += ((r + a) * cols + c).tolist()
        if row_norms is not None:
            norms = torch.linalg.vector_norm(xf, dim=1)  # (n,) fp32; inf when |w| ~ 1e19+
            big = ~torch.isfinite(norms)
            if bool(big.any()):
                norms = norms.double()
                norms[big] = torch.linalg.vector_norm(xf[big].double(), dim=1)
            row_norms[a:b] = norms.double().cpu()
        g0 = a * cols
        smp = xf.reshape(-1)[(-g0) % stride::stride]
        samples.append((smp[torch.isfinite(smp)] if n_bad else smp).cpu())
    st.mean, st.std = (mom.mean, mom.std) if mom.n else (math.nan, math.nan)
    st.min, st.max = (lo, hi) if mom.n else (math.nan, math.nan)
    st.absmax = max(-lo, hi) if mom.n else math.nan
    st.exp_hist = hist
    if bad_rows is not None:
        st.bad_rows = IndexSet.from_counts(bad_rows.cpu())
        st.bad_entries = int(bad_rows.sum())
    if row_norms is not None:
        _extreme_rows(st, row_norms, cfg)
    order = sorted(range(len(top_v)), key=lambda i: -abs(top_v[i]))[:k]
    st.top = [((top_i[i] // cols, top_i[i] % cols), top_v[i]) for i in order]
    return torch.cat(samples) if samples else torch.zeros(0)


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


def _far_values(read: RowReader, chunks, st: TensorStats, cfg: InspectConfig,
                sc: Scratch) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct values (sorted) and their counts among entries beyond lock_min_z / 2 robust
    std — wide enough that every candidate's neighbourhood (below) is inside it."""
    reach = cfg.lock_min_z / 2 * st.scale
    uniq = torch.zeros(0, dtype=torch.float64)
    cnt = torch.zeros(0, dtype=torch.int64)
    for a, b in chunks:
        xf = sc.as_float(read(a, b))
        d = sc.like(sc.tmp, xf)
        torch.sub(xf, st.center, out=d)
        d.abs_()  # NaN stays NaN and compares false
        keep = sc.like(sc.mask, xf)
        torch.gt(d, reach, out=keep)
        if st.overflow or st.nonfinite:  # overflowed entries are overflow, not locked
            keep &= xf.abs() <= cfg.overflow
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
            locked: list[tuple[float, int, float, float]], rows: int, cols: int,
            sc: Scratch) -> None:
    """Rows and columns of each locked value."""
    K = len(locked)
    row_c = torch.zeros(K, rows, dtype=torch.int64)
    col_c = torch.zeros(K, cols, dtype=torch.int64)
    for a, b in chunks:
        xf = sc.as_float(read(a, b))
        eq = sc.like(sc.mask, xf)
        for j, (v, *_) in enumerate(locked):
            torch.eq(xf, v, out=eq)
            if bool(eq.any()):
                row_c[j, a:b] += eq.sum(1).cpu()
                col_c[j] += eq.sum(0).cpu()
    for j, (v, count, z, expected) in enumerate(locked):
        st.locked.append(LockedValue(
            value=v, count=count, z=z, expected=expected,
            rows=IndexSet.from_counts(row_c[j]), cols=IndexSet.from_counts(col_c[j]),
            full_rows=int((row_c[j] == cols).sum()),
        ))
