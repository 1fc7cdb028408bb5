"""`inspect_weights`: the one library call behind `astrai inspect-weights`, and its report."""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from astrai.errors import CheckpointError
from astrai.inspect.config import InspectConfig
from astrai.inspect.patterns import Pattern
from astrai.inspect.next_update import (
    MuonStep,
    Visibility,
    next_update_visibility,
    read_optimizer_state,
)
from astrai.inspect.scan import CheckpointScan, Progress, scan_checkpoint, tensor_lr
from astrai.inspect.source import open_source
from astrai.inspect.stuck import StuckReport, diff_checkpoints
from astrai.inspect.tensor import TensorStats
from astrai.inspect.update_mode import detect_mode
from astrai.inspect.verdict import LABELS, Finding, findings, verdict
from astrai.model.gguf_file import is_gguf


@dataclass
class InspectReport:
    """The inspection of one or more checkpoints (and their diff when several)."""

    config: InspectConfig
    scans: list[CheckpointScan]
    stuck: StuckReport | None
    findings: list[Finding] = field(default_factory=list)
    verdict: str = "healthy"
    """healthy | suspected | found"""

    @property
    def label(self) -> str:
        return LABELS[self.verdict]

    @property
    def exit_code(self) -> int:
        """0 healthy, 1 findings (so pipelines can gate on it)."""
        return 0 if self.verdict == "healthy" else 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "label": self.label,
            "findings": [f.__dict__ for f in self.findings],
            "thresholds": self.config.model_dump(mode="json"),
            "checkpoints": [_scan_dict(s, self.config) for s in self.scans],
            "stuck": _stuck_dict(self.stuck) if self.stuck else None,
        }


def inspect_weights(paths: list[str | Path], config: InspectConfig | None = None,
                    progress: Progress | None = None,
                    adapter: str | Path | None = None,
                    muon_step: MuonStep | None = None) -> InspectReport:
    """Scan each checkpoint; with two or more, also find entries stuck across them.
    `adapter`: a PEFT LoRA directory merged into each checkpoint's weights, in their stored
    dtype, before the scan (what a merged export would hold). Where a checkpoint holds
    optimizer state, each scan also gets its next-update visibility (`muon_step`: how a
    Muon group's matrices step, astrai.inspect.next_update)."""
    cfg = config or InspectConfig()
    if not paths:
        raise CheckpointError("inspect-weights: pass at least one checkpoint")
    if adapter is not None or any(is_gguf(p) for p in paths):
        # a GGUF file is scanned as the weights astrai loads from it (quantized types
        # dequantized), written to a safetensors file for the header-indexed scan
        with tempfile.TemporaryDirectory(prefix="astrai-merged-") as tmp:
            merged = [merged_weights(p, adapter, Path(tmp) / f"{i}-{Path(p).stem}.safetensors")
                      if adapter is not None or is_gguf(p) else p
                      for i, p in enumerate(paths)]
            return inspect_weights(merged, cfg, progress)
    sources = [open_source(p) for p in paths]
    scans = [scan_checkpoint(s, cfg, progress) for s in sources]
    optimizers = [read_optimizer_state(src.path) for src in sources]
    for src, scan, opt in zip(sources, scans, optimizers):
        scan.update = detect_mode([i.dtype for i in src.tensors.values()], src.meta, opt)
        if opt is not None:
            scan.visibility = next_update_visibility(src, opt, muon_step)
    stuck = (diff_checkpoints(sources, cfg, progress, optimizers, muon_step)
             if len(sources) > 1 else None)
    found = findings(scans, stuck, cfg)
    return InspectReport(cfg, scans, stuck, found, verdict(found))


def merged_weights(path: str | Path, adapter: str | Path | None, out: Path) -> Path:
    """Write `path`'s weights with `adapter` merged, if any (stored dtype kept), to `out`."""
    from astrai.model.adapter import merge_adapter
    from astrai.model.checkpoint import save_weights
    from astrai.model.hf import load_pretrained

    model, _, _ = load_pretrained(path, dtype=None)
    if adapter is not None:
        merge_adapter(model, adapter)
    save_weights(model.state_dict(), out)
    return out


# -- JSON ----------------------------------------------------------------------------------

def _num(x: float | None):
    """JSON-safe number: non-finite floats become strings ("nan", "inf")."""
    if x is None or isinstance(x, int):
        return x
    return x if math.isfinite(x) else str(x)


def _pattern_dict(p: Pattern) -> dict[str, Any]:
    return {
        "kind": p.kind, "role": p.role, "value": _num(p.value), "count": p.count,
        "layers": p.layers.to_json(), "rows": p.rows.to_json(), "cols": p.cols.to_json(),
        "same_rows": p.same_rows, "tensors": p.tensors, "description": p.describe(),
    }


def _tensor_dict(st: TensorStats, lr: float | None) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": st.name, "layer": st.param.layer, "kind": st.param.kind, "role": st.param.role,
        "dtype": st.dtype, "shape": list(st.shape), "numel": st.numel,
    }
    if st.skipped:
        d["skipped"] = st.skipped
        return d
    d.update({
        "mean": _num(st.mean), "std": _num(st.std), "min": _num(st.min), "max": _num(st.max),
        "absmax": _num(st.absmax), "nonfinite": st.nonfinite, "overflow": st.overflow,
        "zeros": st.zeros, "exact_one": st.exact_one, "median": _num(st.center),
        "robust_std": _num(st.scale), "dominant": _num(st.dominant),
        "locked": [{
            "value": _num(lv.value), "count": lv.count, "z": _num(lv.z),
            "expected": _num(lv.expected), "rows": lv.rows.to_json(), "cols": lv.cols.to_json(),
            "full_rows": lv.full_rows,
        } for lv in st.locked],
        "bad_rows": st.bad_rows.to_json(),
        "extreme_rows": [[r, _num(n)] for r, n in st.extreme_rows[:1024]],
        "row_norm_median": _num(st.row_norm_median),
        "top": [{"row": r, "col": c, "value": _num(v)} for (r, c), v in st.top],
    })
    if lr:
        d["dead_zone_fraction"] = st.dead_zone(lr) / max(st.numel - st.nonfinite, 1)
    return d


def _scan_dict(s: CheckpointScan, cfg: InspectConfig) -> dict[str, Any]:
    return {
        "path": s.path, "format": s.format, "step": s.step, "lr": s.lr, "lr_source": s.lr_source,
        "muon_lr": s.muon_lr,
        "n_params": s.n_params,
        "totals": {"locked": s.locked, "nonfinite": s.nonfinite, "overflow": s.overflowed,
                   "extreme_rows": s.extreme_rows},
        "patterns": [_pattern_dict(p) for p in s.patterns],
        "gain_patterns": [_pattern_dict(p) for p in s.gain_patterns],
        "overflow": [{
            "kind": g.kind, "role": g.role, "entries": g.entries, "nonfinite": g.nonfinite,
            "layers": g.layers.to_json(), "rows": g.rows.to_json(), "absmax": _num(g.absmax),
        } for g in s.overflow],
        "gains": [{
            "kind": g.kind, "tensors": g.tensors, "entries": g.entries, "exact_one": g.exact_one,
            "min": _num(g.min), "max": _num(g.max),
            "locked": [[_num(v), c] for v, c in g.locked],
        } for g in s.gains],
        "dead_zone": [{
            "lr": z.lr, "fraction": z.fraction, "entries": z.entries, "total": z.total,
            "matrix_fraction": z.matrix_fraction, "muon_lr": z.muon_lr,
        } for z in s.dead_zone],
        "offenders": [st.name for st in s.offenders(cfg.top)],
        "top_entries": [{"tensor": n, "row": r, "col": c, "value": _num(v)}
                        for n, (r, c), v in s.top_entries(cfg.top)],
        "tensors": [_tensor_dict(st, s.lr and tensor_lr(st, s.lr, s.muon_lr))
                    for st in s.tensors],
        "next_update": _visibility_dict(s.visibility) if s.visibility else None,
        "update_mode": ({"mode": s.update.mode, "source": s.update.source}
                        if s.update else None),
    }


def _visibility_dict(v: Visibility) -> dict[str, Any]:
    return {
        "entries": v.entries, "below_half_ulp": v.below, "fraction": v.fraction,
        "note": v.note,
        "tensors": [{
            "name": t.name, "optimizer": t.optimizer, "entries": t.entries,
            "below_half_ulp": t.below, "fraction": t.fraction, "lr": t.lr,
            "lr_to_move": _num(t.lr_to_move), "peak_lr": t.peak_lr,
        } for t in v.tensors],
    }


def _stuck_dict(r: StuckReport) -> dict[str, Any]:
    return {
        "paths": r.paths, "stuck": r.stuck, "moving_entries": r.moving_entries,
        "fraction": r.stuck / r.moving_entries if r.moving_entries else 0.0,
        "unchanged": r.unchanged, "mismatched": r.mismatched,
        "expected": r.expected, "expected_sd": r.variance ** 0.5, "modelled": r.modelled,
        "tensors": [{
            "name": t.name, "role": t.param.role, "numel": t.numel, "stuck": t.stuck,
            "moved_fraction": t.moved_fraction, "status": t.status, "counted": t.counted,
            "rows": t.rows.to_json(), "cols": t.cols.to_json(), "full_rows": t.full_rows,
            "mean_abs": _num(t.mean_abs), "expected": t.expected, "compared": t.compared,
        } for t in r.tensors],
    }
