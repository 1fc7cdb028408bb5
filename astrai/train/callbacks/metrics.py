"""Metrics: one JSON line per logged optimizer step in RUN_DIR/metrics.jsonl (rank 0).

A record: step, epoch, loss, lr, grad_norm, tokens, loss_tokens (over all ranks),
tokens_per_s and mfu (over the steps since the previous record), memory_mb,
consumed_samples, consumed_tokens, elapsed_s, the strategy's metrics (token-weighted means
over the window and the ranks: e.g. seq_loss, moe_aux_loss, moe_aux_loss_weighted) and
figures other callbacks added, `skipped` when the step was skipped, and val_loss / val_ppl /
val_bpb on the steps where the trainer validated (every `eval_interval` steps and at the
last step). Records are written on the trainer's logged steps (every `log_interval` steps,
validation steps, the last step, and steps a callback asked to record: StepControl.
request_record), the only steps whose figures are read from the device.

Records are flushed one by one, so a killed run keeps every line it logged. A resumed run
first drops the records after its checkpoint's step, so no step appears twice.
"""

from __future__ import annotations

import json
import math
import resource
import time
from pathlib import Path
from typing import Any

import torch

from astrai.atomic import write_text_atomic
from astrai.train.callbacks.base import Callback
from astrai.train.flops import DevicePeak, measure_peak_flops, time_matmul, train_flops_per_token


def truncate_after(path: Path, step: int) -> None:
    """Keep only records with record['step'] <= step (atomically rewritten)."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        if rec.get("step", 0) <= step:
            keep.append(line)
    write_text_atomic(path, "".join(k + "\n" for k in keep))


def memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class MetricsCallback(Callback):
    name = "metrics"
    writes_record = True

    def __init__(self, *, log_interval: int = 1, peak_tflops: float | None = None) -> None:
        self.log_interval = log_interval
        self.peak_tflops = peak_tflops
        self.records: list[dict[str, Any]] = []
        self._file = None
        self._t0 = 0.0
        self._elapsed_before = 0.0
        self._tokens, self._time = 0, 0.0  # since the last record

    # -- lifecycle ----------------------------------------------------------------------------
    def on_train_begin(self, ctx) -> None:
        dev = ctx.executor.device
        dtype = torch.bfloat16 if ctx.executor.precision.name.startswith("bf16") \
            else torch.float32
        # Wide enough to come near the device's best matmul rate (a narrow one reads low and
        # makes MFU read high).
        n = 2048 if dev.type == "cpu" else 8192
        if self.peak_tflops:
            self.peak = DevicePeak(self.peak_tflops * 1e12)
        else:
            self.peak = DevicePeak(measure_peak_flops(str(dev), dtype, n),
                                   lambda: time_matmul(str(dev), dtype, n))
        self.flops_per_token = train_flops_per_token(ctx.model_config, ctx.seq_len)
        self._t0 = time.perf_counter()
        if ctx.is_main:
            truncate_after(ctx.paths.metrics, ctx.state.step)
            self._file = ctx.paths.metrics.open("a")

    def on_step_end(self, ctx, report, control) -> None:
        # tokens/s over the steps since the last record: with the device running ahead of
        # the host, one step's host time says little; a window of them does.
        self._tokens += report.tokens
        self._time += report.step_time
        step = report.step
        due = step % self.log_interval == 0 or report.done or report.evaluated or \
            getattr(control, "record_requested", False)
        if not (due and report.logged):
            return
        tps = self._tokens / max(1e-9, self._time)
        self._tokens, self._time = 0, 0.0
        rec: dict[str, Any] = {
            "step": step, "epoch": report.epoch,
            "loss": _clean(report.loss), "lr": report.lr,
            "grad_norm": _clean(report.grad_norm),
            "tokens": report.tokens, "loss_tokens": report.loss_units,
            "tokens_per_s": round(tps, 2),
            "mfu": round(self.peak.mfu(tps * self.flops_per_token / ctx.world_size), 6),
            "memory_mb": round(memory_mb(ctx.executor.device), 1),
            "consumed_samples": ctx.state.consumed_samples,
            "consumed_tokens": ctx.state.consumed_tokens,
            "elapsed_s": round(self._elapsed_before + time.perf_counter() - self._t0, 3),
        }
        rec.update({k: _clean(v) for k, v in report.metrics.items()})
        if report.skipped:
            rec["skipped"] = True
        if report.evaluated:
            rec.update({k: _clean(v) for k, v in report.eval.items()})
        self._write(ctx, rec)

    def _write(self, ctx, rec: dict[str, Any]) -> None:
        self.records.append(rec)
        if self._file is not None:
            self._file.write(json.dumps(rec) + "\n")
            self._file.flush()

    def on_error(self, ctx, error: BaseException) -> None:
        self._close()

    def on_train_end(self, ctx) -> None:
        self._close()

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    # elapsed time carries over a resume, so elapsed_s keeps growing
    def state_dict(self) -> dict[str, Any]:
        return {"elapsed_s": self._elapsed_before + time.perf_counter() - self._t0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._elapsed_before = float(state.get("elapsed_s", 0.0))


def _clean(v: Any) -> Any:
    """JSON has no NaN/inf: write them as strings so the line stays valid JSON."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v
