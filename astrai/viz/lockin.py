"""The lock-in picture of a checkpoint scan: where the locked weights are (layer x matrix
heatmap of the locked fraction) and where they sit among all values (a histogram of |w| per
binade with the locked values and the BF16 dead zone of the run's learning rate marked).

Both come from what inspect-weights already measured (TensorStats.locked and the per-binade
exponent histogram), so drawing reads no weights again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from astrai.inspect.bf16 import EXP_OFFSET, dead_zone_threshold
from astrai.inspect.names import parse_name
from astrai.inspect.scan import CheckpointScan
from astrai.viz.figure import new_figure

MATRIX_ROLES = ("matrix", "embedding", "lm_head")
ORDER = ("q_proj", "k_proj", "v_proj", "o_proj", "router", "gate_proj", "up_proj", "down_proj")
"""Columns in the order a block computes them (others after, by name)."""
MAX_MARKED = 6
"""Locked values marked on the histogram (the most frequent)."""


@dataclass
class LockinGrid:
    """Locked fraction of every block matrix: fraction[i][j] for layers[i], kinds[j]
    (nan where that layer has no such matrix)."""

    layers: list[int]
    kinds: list[str]
    fraction: list[list[float]]
    locked: list[list[int]]
    outside: list[tuple[str, float]]
    """Matrices outside the blocks (embedding, head): (name, locked fraction)."""


def lockin_grid(scan: CheckpointScan) -> LockinGrid:
    cells: dict[tuple[int, str], tuple[int, int]] = {}
    kinds: dict[str, None] = {}
    outside = []
    for st in scan.tensors:
        if st.skipped or st.param.role not in MATRIX_ROLES:
            continue
        if st.param.layer is None:
            outside.append((st.param.short, st.locked_count / st.numel))
            continue
        kinds.setdefault(st.param.short)
        cells[(st.param.layer, st.param.short)] = (st.locked_count, st.numel)
    layers = sorted({layer for layer, _ in cells})
    kinds = dict.fromkeys(sorted(kinds, key=_kind_order))
    frac = [[cells[(i, k)][0] / cells[(i, k)][1] if (i, k) in cells else math.nan
             for k in kinds] for i in layers]
    locked = [[cells.get((i, k), (0, 0))[0] for k in kinds] for i in layers]
    return LockinGrid(layers, list(kinds), frac, locked, outside)


def visibility_grid(scan: CheckpointScan) -> LockinGrid | None:
    """Share of entries whose next update is below half an ulp, per layer x tensor kind
    (gains included: they start at 1.0, where the ulp is coarse); None without optimizer
    state. `locked` holds those entries' counts."""
    if scan.visibility is None or not scan.visibility.tensors:
        return None
    cells: dict[tuple[int, str], tuple[int, int]] = {}
    outside = []
    for t in scan.visibility.tensors:
        p = parse_name(t.name, 2)
        if p.layer is None:
            outside.append((p.short, t.fraction))
        else:
            cells[(p.layer, p.short)] = (t.below, t.entries)
    layers = sorted({layer for layer, _ in cells})
    kinds = sorted({k for _, k in cells}, key=_kind_order)
    frac = [[cells[(i, k)][0] / cells[(i, k)][1] if (i, k) in cells else math.nan
             for k in kinds] for i in layers]
    below = [[cells.get((i, k), (0, 0))[0] for k in kinds] for i in layers]
    return LockinGrid(layers, kinds, frac, below, outside)


def _kind_order(kind: str) -> tuple[int, str]:
    last = kind.rsplit(".", 1)[-1]
    return (ORDER.index(last) if last in ORDER else len(ORDER), kind)


@dataclass
class ValueHistogram:
    """|w| of every matrix entry per binade: counts[i] entries in [edges[i], edges[i+1])."""

    edges: list[float]
    counts: list[int]
    locked: list[tuple[float, int]]
    """Locked values and their entries, most frequent first."""
    lr: float | None
    dead_zone: float | None
    """|w| at and above which an update of size lr rounds away in BF16."""
    beyond: int = 0
    """Entries in binades wholly above the overflow threshold (counted, not drawn)."""
    overflow: float = 1e4


def value_histogram(scan: CheckpointScan, overflow: float = 1e4) -> ValueHistogram:
    """Binades whose lower edge is above `overflow` (inspect-weights --overflow) are counted
    in `beyond` rather than drawn, so one overflowed entry at 2^120 does not squash the
    picture of the healthy values into a corner."""
    total = None
    locked: dict[float, int] = {}
    for st in scan.tensors:
        if st.skipped or st.param.role not in MATRIX_ROLES or st.exp_hist is None:
            continue
        h = st.exp_hist.cpu()
        total = h.clone() if total is None else total + h
        for lv in st.locked:
            locked[lv.value] = locked.get(lv.value, 0) + lv.count
    dz = dead_zone_threshold(scan.lr) if scan.lr else None
    marked = sorted(locked.items(), key=lambda t: -t[1])
    if total is None or not bool(total.any()):
        return ValueHistogram([], [], marked, scan.lr, dz, 0, overflow)
    cut = min(total.numel(), EXP_OFFSET + math.floor(math.log2(overflow)) + 1)
    beyond = int(total[cut:].sum())
    nz = total[:cut].nonzero().flatten()
    if not nz.numel():
        return ValueHistogram([], [], marked, scan.lr, dz, beyond, overflow)
    lo, hi = int(nz[0]), int(nz[-1]) + 1
    edges = [2.0 ** (b - EXP_OFFSET) for b in range(lo, hi + 1)]
    return ValueHistogram(edges, [int(c) for c in total[lo:hi]], marked, scan.lr, dz, beyond,
                          overflow)


def lockin_figure(scans: Sequence[CheckpointScan], *, size: tuple[int, int] | None = None,
                  overflow: float = 1e4) -> Any:
    """One row per checkpoint: the heatmap (left) and the histogram (right). The heatmap's
    image holds LockinGrid.fraction; cells with locked entries are labelled in percent."""
    grids = [visibility_grid(s) for s in scans]
    cols = 3 if any(grids) else 2
    size = size or (600 * cols, 450 * len(scans))
    fig = new_figure(size)
    axes = fig.subplots(len(scans), cols, squeeze=False, width_ratios=[1, 1.4, 1][:cols])
    for row, scan, vis in zip(axes, scans, grids, strict=True):
        name = scan.path + (f" (step {scan.step})" if scan.step is not None else "")
        _heatmap(row[0], lockin_grid(scan), name)
        _histogram(row[1], value_histogram(scan, overflow))
        if cols == 3 and vis is not None:
            _heatmap(row[2], vis, name, VISIBILITY)
        elif cols == 3:
            row[2].set_axis_off()
    return fig


@dataclass(frozen=True)
class HeatmapText:
    """What a heatmap shows: its gid, colour map, title and empty-grid note."""

    gid: str = "locked_fraction"
    cmap: str = "Reds"
    label: str = "locked fraction"
    title: str = "locked fraction per matrix"
    empty: str = "no locked weights"


VISIBILITY = HeatmapText("below_half_ulp", "Blues", "next update below half an ulp",
                         "next update below half an ulp (optimizer state)",
                         "every next update is visible")


def _heatmap(ax: Any, g: LockinGrid, name: str, text: HeatmapText = HeatmapText()) -> None:
    import numpy as np

    data = np.array(g.fraction, dtype=float).reshape(len(g.layers), len(g.kinds))
    peak = float(np.nanmax(data)) if data.size and not np.isnan(data).all() else 0.0
    vmax = peak if peak > 0 else 1.0
    im = ax.imshow(np.ma.masked_invalid(data), cmap=text.cmap, vmin=0.0, vmax=vmax,
                   aspect="auto", interpolation="nearest")
    im.set_gid(text.gid)
    ax.set_xticks(range(len(g.kinds)), g.kinds, rotation=35, ha="right", fontsize="small")
    ax.set_yticks(range(len(g.layers)), [f"layer {i}" for i in g.layers], fontsize="small")
    for i in range(len(g.layers)):
        for j in range(len(g.kinds)):
            if g.locked[i][j]:
                v = data[i, j]
                label = f"{100 * v:.3g}%" if v < 1 else "100%"
                ax.text(j, i, label, ha="center", va="center", fontsize="x-small",
                        color="white" if v > 0.6 * vmax else "black", gid=f"cell|{i}|{j}")
    if peak == 0:
        ax.text(0.5, 0.5, text.empty, transform=ax.transAxes, ha="center",
                va="center", color="0.4")
    title = f"{text.title}\n{name}"
    out = [f"{k} {100 * f:.3g}%" for k, f in g.outside if f > 0]
    if out:
        title += "\noutside the blocks: " + ", ".join(out)
    ax.set_title(title, fontsize="small")
    ax.figure.colorbar(im, ax=ax, fraction=0.05, pad=0.02, label=text.label)


def _histogram(ax: Any, h: ValueHistogram) -> None:
    if h.counts:
        ax.stairs(h.counts, h.edges, fill=True, color="0.6", label="entries per binade of |w|")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
    if h.dead_zone is not None and h.edges:
        # drawn even when every weight lies below it: how far off it is is the finding
        right = max(h.edges[-1], 4 * h.dead_zone)
        ax.axvspan(h.dead_zone, right, color="tab:blue", alpha=0.15, gid="dead_zone",
                   label=f"BF16 dead zone at lr {h.lr:g}: |w| ≥ {h.dead_zone:g}")
        ax.set_xlim(h.edges[0], right)
    for k, (v, n) in enumerate(h.locked[:MAX_MARKED]):
        if v != 0:
            ax.axvline(abs(v), color=f"C{(k + 3) % 10}", linewidth=1.5, gid=f"locked|{v!r}",
                       label=f"locked at {v:g} ({n:,} entries)")
    ax.set_xlabel("|w| (binades of powers of two)")
    ax.set_ylabel("entries")
    title = "values of the matrices"
    if h.beyond:
        title += f"; {h.beyond:,} overflowed entries (|w| > {h.overflow:g}) not drawn"
    if h.lr is None:
        title += " (learning rate unknown: pass --lr to mark the dead zone)"
    ax.set_title(title, fontsize="small")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small", loc="upper left")
