"""Stuck weights: entries bit-identical across checkpoints of one run while their tensor moved.

A locked weight cannot move (its updates are under half a BF16 ULP, docs/bf16-lockin.md
"Stage 3"), so between two checkpoints it stays bit-identical while its neighbours change.
Entries are compared bit for bit (NaN == NaN, +0 != -0), chunk by chunk across all files.

An unbiased rounding also leaves some entries unchanged: one whose updates are a small part
of its ulp moves only now and then. Where the checkpoints hold their optimizer state and
step, each compared entry gets the probability that an unbiased rounding leaves it unchanged
(astrai.inspect.unchanged), and the report sets the stuck count beside that expectation: a
binomial count of independent entries, mean sum(p), variance sum(p (1 - p)). A Kahan run's
entries are compared as the weight its optimizer works on, w + kahan_comp.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from astrai.errors import CheckpointError
from astrai.inspect.config import InspectConfig
from astrai.inspect.names import ParamName, parse_name
from astrai.inspect.ranges import IndexSet
from astrai.inspect.scan import Progress
from astrai.inspect.source import WeightSource
from astrai.inspect.unchanged import TensorHistory, histories

_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass
class StuckTensor:
    """One tensor compared across the checkpoints."""

    name: str
    param: ParamName
    numel: int
    stuck: int
    """Entries bit-identical in every checkpoint."""
    status: str
    """moving (>= stuck_min_moved of entries changed) | partial | unchanged."""
    rows: IndexSet
    cols: IndexSet
    full_rows: int
    mean_abs: float
    """Mean |w| of the stuck entries."""
    expected: float | None = None
    """Entries an unbiased rounding would leave unchanged (sum of their probabilities);
    None without optimizer state and steps to model it."""
    variance: float = 0.0
    """The binomial variance of that count, sum(p (1 - p))."""
    compared: str = "stored"
    """stored | compensated (w + kahan_comp of a Kahan run)."""

    @property
    def moved_fraction(self) -> float:
        return 1.0 - self.stuck / self.numel if self.numel else 0.0

    @property
    def counted(self) -> bool:
        """Counts toward the verdict. With the unbiased-rounding expectation (the optimizer
        trained it, so a wholly unchanged tensor is not a frozen one): every tensor, its
        expectation being the null. Without: a moving matrix that is not the input
        embedding (rows of tokens absent from the data never get a gradient)."""
        if self.expected is not None:
            return True
        return self.status == "moving" and self.param.role in ("matrix", "lm_head")


@dataclass
class StuckReport:
    """Bit-identical entries across two or more checkpoints of one run."""

    paths: list[str]
    tensors: list[StuckTensor]
    mismatched: list[str] = field(default_factory=list)
    """Tensors missing from some checkpoint or of different shape/dtype (not compared)."""

    @property
    def stuck(self) -> int:
        """Stuck entries of the counted tensors (the figure the verdict uses)."""
        return sum(t.stuck for t in self.tensors if t.counted)

    @property
    def expected(self) -> float:
        """Stuck entries of the counted tensors an unbiased rounding explains (0 for tensors
        without a model)."""
        return sum(t.expected or 0.0 for t in self.tensors if t.counted)

    @property
    def variance(self) -> float:
        return sum(t.variance for t in self.tensors if t.counted)

    @property
    def modelled(self) -> bool:
        """Every counted tensor has its expectation (optimizer state and steps were read),
        and there is one."""
        counted = [t for t in self.tensors if t.counted]
        return bool(counted) and all(t.expected is not None for t in counted)

    def excess(self, factor: float, z: float) -> float:
        """Stuck entries beyond what an unbiased rounding explains: stuck minus
        (factor x expected + z binomial standard deviations)."""
        return self.stuck - (factor * self.expected + z * self.variance ** 0.5)

    @property
    def moving_entries(self) -> int:
        """Entries of the counted tensors (moving matrices without the model; every
        optimizer-trained tensor with it). The JSON keeps the name."""
        return sum(t.numel for t in self.tensors if t.counted)

    @property
    def unchanged(self) -> list[str]:
        return [t.name for t in self.tensors if t.status == "unchanged"]


def diff_checkpoints(sources: list[WeightSource], cfg: InspectConfig,
                     progress: Progress | None = None,
                     optimizers: list[dict | None] | None = None,
                     muon_step=None) -> StuckReport:
    """Compare every tensor common to all `sources`, one chunk of rows at a time.
    `optimizers`: each source's optimizer state (or None), for the unbiased-rounding
    expectation; `muon_step` as in astrai.inspect.next_update."""
    first, rest = sources[0], sources[1:]
    common, mismatched = [], []
    for name, info in first.tensors.items():
        others = [s.tensors.get(name) for s in rest]
        if all(o is not None and o.shape == info.shape and o.dtype == info.dtype
               for o in others):
            if info.torch_dtype is not None and info.numel:
                common.append(name)
        else:
            mismatched.append(name)
    for s in rest:
        mismatched += [n for n in s.tensors if n not in first.tensors]
    if not common:
        raise CheckpointError(
            f"{first.path} and {rest[0].path}: no tensor in common (same name, shape, dtype); "
            "pass checkpoints of one run"
        )
    out = []
    hist = histories(sources, optimizers, muon_step)
    for i, name in enumerate(common):
        if progress:
            progress(name, i, len(common))
        out.append(_compare(sources, name, cfg, hist(name)))
    return StuckReport([str(s.path) for s in sources], out, sorted(set(mismatched)))


def _compare(sources: list[WeightSource], name: str, cfg: InspectConfig,
             hist: TensorHistory | None) -> StuckTensor:
    info = sources[0].tensors[name]
    rows, cols = info.rows, info.cols
    row_c = torch.zeros(rows, dtype=torch.int64)
    col_c = torch.zeros(cols, dtype=torch.int64)
    abs_sum = 0.0
    step = max(1, cfg.chunk_elements // max(cols, 1))
    read = hist.read if hist is not None else (lambda k, a, b: sources[k].read_rows(name, a, b))
    x_dtype = hist.dtype if hist is not None else info.torch_dtype
    int_dtype = _INT_VIEW[torch.empty(0, dtype=x_dtype).element_size()]
    for a in range(0, rows, step):
        b = min(a + step, rows)
        x0 = read(0, a, b)
        base = x0.view(int_dtype)
        same = torch.ones_like(base, dtype=torch.bool)
        for k in range(1, len(sources)):
            same &= read(k, a, b).view(int_dtype) == base
        row_c[a:b] = same.sum(1)
        col_c += same.sum(0)
        if bool(same.any()):
            abs_sum += float(x0[same].double().abs().nan_to_num(posinf=0.0).sum())
    stuck = int(row_c.sum())
    numel = info.numel
    moved = 1.0 - stuck / numel
    status = "unchanged" if stuck == numel else (
        "moving" if moved >= cfg.stuck_min_moved else "partial")
    expected, variance = hist.expectation() if hist is not None else (None, 0.0)
    return StuckTensor(
        name=name, param=parse_name(name, len(info.shape)), numel=numel, stuck=stuck,
        status=status, rows=IndexSet.from_counts(row_c), cols=IndexSet.from_counts(col_c),
        full_rows=int((row_c == cols).sum()), mean_abs=abs_sum / stuck if stuck else 0.0,
        expected=expected, variance=variance,
        compared="compensated" if hist is not None and hist.compensated else "stored",
    )
