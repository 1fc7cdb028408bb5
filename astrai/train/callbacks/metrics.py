"""Metrics: one JSON line per logged optimizer step in RUN_DIR/metrics.jsonl (rank 0).

A record: step, epoch, loss, lr, grad_norm, tokens, loss_tokens, tokens_per_s, mfu,
memory_mb, consumed_samples, consumed_tokens, elapsed_s, the strategy's metrics
(token-weighted means over the window: e.g. seq_loss, moe_aux_loss, moe_aux_loss_weighted),
`skipped` when the step was skipped, and val_loss / val_ppl / val_bpb on the steps where
the trainer validated (every `eval_interval` steps and at the last step).

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

    def on_step_end(self, ctx) -> None:
        step = ctx.state.step
        if not (step % self.log_interval == 0 or ctx.done or ctx.evaluated):
            return
        step_time = max(1e-9, ctx.step_time)
        tokens = ctx.window_tokens
        tps = tokens / step_time
        rec: dict[str, Any] = {
            "step": step, "epoch": ctx.state.epoch,
            "loss": _clean(ctx.step_loss), "lr": ctx.lr, "grad_norm": _clean(ctx.grad_norm),
            "tokens": tokens, "loss_tokens": ctx.window_units,
            "tokens_per_s": round(tps, 2),
            "mfu": round(self.peak.mfu(tps * self.flops_per_token / ctx.world_size), 6),
            "memory_mb": round(memory_mb(ctx.executor.device), 1),
            "consumed_samples": ctx.state.consumed_samples,
            "consumed_tokens": ctx.state.consumed_tokens,
            "elapsed_s": round(self._elapsed_before + time.perf_counter() - self._t0, 3),
        }
        rec.update({k: _clean(v) for k, v in ctx.step_metrics.items()})
        if ctx.skip_step:
            rec["skipped"] = True
        if ctx.evaluated:
            rec.update({k: _clean(v) for k, v in ctx.last_eval.items()})
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
