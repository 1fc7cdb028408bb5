"""One checkpoint scanned tensor by tensor: stats, locked patterns, overflow, dead zone."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from astrai.inspect.config import InspectConfig
from astrai.inspect.names import is_muon_matrix, parse_name
from astrai.inspect.patterns import (
    GainSummary,
    OverflowGroup,
    Pattern,
    gain_summaries,
    locked_patterns,
    overflow_groups,
)
from astrai.inspect.source import WeightSource, find_muon_lr
from astrai.inspect.tensor import TensorStats, analyze_tensor
from astrai.inspect.next_update import Visibility
from astrai.inspect.update_mode import UpdateMode

Progress = Callable[[str, int, int], None]
"""progress(tensor name, index, total) — the CLI draws it on stderr; the library never prints."""


@dataclass
class DeadZone:
    """Share of weights an update of size lr cannot move in BF16 (lr < ULP(|w|) / 2)."""

    lr: float
    entries: int
    total: int
    matrix_entries: int
    matrix_total: int
    muon_lr: float | None = None
    """Muon's lr, used instead of `lr` for the hidden matrices a Muon run updated with it
    (the run's row only)."""

    @property
    def fraction(self) -> float:
        return self.entries / self.total if self.total else 0.0

    @property
    def matrix_fraction(self) -> float:
        return self.matrix_entries / self.matrix_total if self.matrix_total else 0.0


@dataclass
class CheckpointScan:
    """Everything found in one checkpoint."""

    path: str
    format: str
    step: int | None
    lr: float | None
    """The learning rate used for the dead-zone figure (flag, else meta.json)."""
    lr_source: str | None
    tensors: list[TensorStats]
    muon_lr: float | None = None
    """The lr Muon stepped the hidden matrices with (a Muon run's meta.json), else None."""
    patterns: list[Pattern] = field(default_factory=list)
    gain_patterns: list[Pattern] = field(default_factory=list)
    overflow: list[OverflowGroup] = field(default_factory=list)
    gains: list[GainSummary] = field(default_factory=list)
    dead_zone: list[DeadZone] = field(default_factory=list)
    """First the run's lr (when known), then the configured ladder."""
    visibility: Visibility | None = None
    """Next-update visibility from the checkpoint's optimizer state (None: it has none)."""
    update: UpdateMode | None = None
    """How the run wrote the weights (nearest, stochastic, kahan, fp32); None for live
    parameters, whose guard reads it from the optimizer."""

    @property
    def n_params(self) -> int:
        return sum(st.numel for st in self.tensors)

    @property
    def locked(self) -> int:
        """Locked entries in matrices (embedding and LM head included), not in 1-D gains."""
        return sum(st.locked_count for st in self.tensors if st.param.role != "gain")

    @property
    def nonfinite(self) -> int:
        return sum(st.nonfinite for st in self.tensors)

    @property
    def overflowed(self) -> int:
        return sum(st.overflow for st in self.tensors)

    @property
    def extreme_rows(self) -> int:
        return sum(len(st.extreme_rows) for st in self.tensors)

    def offenders(self, n: int) -> list[TensorStats]:
        """Tensors with the most locked, overflowed or non-finite entries."""
        def bad(st: TensorStats) -> int:
            locked = st.locked_count if st.param.role != "gain" else 0
            return locked + st.overflow + st.nonfinite + len(st.extreme_rows)
        hit = [st for st in self.tensors if bad(st)]
        return sorted(hit, key=bad, reverse=True)[:n]

    def top_entries(self, n: int) -> list[tuple[str, tuple[int, int], float]]:
        """The largest-magnitude matrix entries (tensor, (row, col), value); 1-D gains are
        summarised on their own."""
        allv = [(st.name, rc, v) for st in self.tensors if st.param.role not in
                ("gain", "scalar") for rc, v in st.top]
        return sorted(allv, key=lambda t: -abs(t[2]) if t[2] == t[2] else 0)[:n]


def tensor_lr(st: TensorStats, lr: float, muon_lr: float | None) -> float:
    """The lr that stepped tensor `st`: muon_lr for a Muon run's hidden matrices, else lr."""
    return muon_lr if muon_lr and is_muon_matrix(st.param, len(st.shape)) else lr


def dead_zones(tensors: list[TensorStats], lrs: list[float],
               muon_lr: float | None = None) -> list[DeadZone]:
    """One DeadZone per lr; the first (the run's) steps the hidden matrices at `muon_lr`
    when the run used Muon."""
    out = []
    live = [st for st in tensors if st.skipped is None]
    total = sum(st.numel - st.nonfinite for st in live)
    mats = [st for st in live if st.param.role != "gain" and st.param.role != "scalar"]
    mtotal = sum(st.numel - st.nonfinite for st in mats)
    for i, lr in enumerate(lrs):
        muon = muon_lr if i == 0 else None
        out.append(DeadZone(
            lr=lr, entries=sum(st.dead_zone(tensor_lr(st, lr, muon)) for st in live),
            total=total, matrix_entries=sum(st.dead_zone(tensor_lr(st, lr, muon))
                                            for st in mats),
            matrix_total=mtotal, muon_lr=muon,
        ))
    return out


def summarize(path: str, fmt: str, step: int | None, lr: float | None, lr_source: str | None,
              tensors: list[TensorStats], cfg: InspectConfig,
              muon_lr: float | None = None) -> CheckpointScan:
    """Group per-tensor results into a CheckpointScan (shared by files and live models)."""
    lrs = ([lr] if lr else []) + [x for x in cfg.dead_zone_lrs if x != lr]
    muon_lr = muon_lr if lr else None  # only beside a known run lr
    return CheckpointScan(
        path=path, format=fmt, step=step, lr=lr, lr_source=lr_source, tensors=tensors,
        muon_lr=muon_lr,
        patterns=locked_patterns(tensors), gain_patterns=locked_patterns(tensors, gains=True),
        overflow=overflow_groups(tensors), gains=gain_summaries(tensors),
        dead_zone=dead_zones(tensors, lrs, muon_lr),
    )


def scan_checkpoint(source: WeightSource, cfg: InspectConfig,
                    progress: Progress | None = None) -> CheckpointScan:
    """Analyse every float tensor of a checkpoint, one tensor (and one chunk) at a time."""
    stats: list[TensorStats] = []
    names = list(source.tensors)
    for i, name in enumerate(names):
        info = source.tensors[name]
        if progress:
            progress(name, i, len(names))
        param = parse_name(name, len(info.shape))
        if info.torch_dtype is None:
            st = TensorStats(name, param, info.dtype, info.shape, info.numel)
            st.skipped = f"dtype {info.dtype} not inspected"
        else:
            st = analyze_tensor(
                lambda a, b, n=name: source.read_rows(n, a, b),
                param, info.shape, info.torch_dtype, cfg,
            )
        stats.append(st)
    muon_lr = None
    if cfg.lr is not None:  # the user's one lr for every tensor
        lr, lr_src = cfg.lr, "--lr"
    else:
        lr, lr_src = source.lr_from_meta()
        lr_src = f"meta.json:{lr_src}" if lr_src else None
        muon_lr, _ = find_muon_lr(source.meta)
    step = source.meta.get("step")
    return summarize(str(source.path), source.format, step if isinstance(step, int) else None,
                     lr, lr_src, stats, cfg, muon_lr)
