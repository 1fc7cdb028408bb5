"""Training precision on this device: astrai's Trainer in bf16-mixed and bf16-true against fp32.

On CPUs with bf16 matrix units (Intel AMX-BF16, e.g. Sapphire Rapids) a bf16 matmul runs
about 2.3x fp32, so bf16 training can be faster than fp32; without them (AVX2 machines) a bf16
matmul is emulated and hundreds of times slower, and run_all skips this benchmark there.
Same preset, data, batch and thread count for every precision; the three runs alternate in
rounds so a busy machine slows them alike; per-step times exclude the first `--warmup` steps.

    python benchmarks/train_precision.py --presets tiny small --steps 8 --rounds 2

Prints tokens/s per precision and the ratios bf16-mixed/fp32 and bf16-true/fp32 (> 1 is
faster than fp32), and the bf16 and fp32 matmul rates of this machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from train_throughput import Rows, collate  # benchmarks/train_throughput.py

from astrai.config.train import TrainConfig
from astrai.model import get_preset
from astrai.train import train
from astrai.train.callbacks import Callback
from astrai.train.data import TrainData
from astrai.train.flops import time_matmul

PRECISIONS = ("fp32", "bf16-mixed", "bf16-true")


class StepTimes(Callback):
    """Seconds of each step, from the end of the previous one (data loading included)."""

    name = "step_times"

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_begin(self, ctx) -> None:
        self.start = time.perf_counter()

    def on_step_end(self, ctx, report, control) -> None:
        now = time.perf_counter()
        self.times.append(now - self.start)
        self.start = now


def run(preset: str, precision: str, B: int, T: int, warmup: int, steps: int) -> list[float]:
    cfg = get_preset(preset)
    n = warmup + steps
    td = TrainData(dataset=Rows(B * n, T, cfg.vocab_size), kind="pretrain", seq_len=T,
                   collate_fn=collate, vocab_size=cfg.vocab_size)
    timer = StepTimes()
    with tempfile.TemporaryDirectory() as tmp:
        config = TrainConfig(model=preset, out=str(Path(tmp) / "run"), batch_size=B,
                             max_lr=3e-4, warmup_steps=0, ckpt_interval=0, max_steps=n,
                             device="cpu", precision=precision, peak_tflops=1.0)
        train(config, data=td, callbacks=[timer])
    return timer.times[warmup:]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    f32 = time_matmul("cpu", torch.float32, 2048, 1.0)
    b16 = time_matmul("cpu", torch.bfloat16, 2048, 1.0)
    print(f"threads {args.threads}; 2048^3 matmul: fp32 {f32 / 1e9:.1f} GFLOP/s, bf16 "
          f"{b16 / 1e9:.1f} GFLOP/s ({b16 / f32:.2f}x); batch {args.batch} x {args.seq}",
          flush=True)
    for preset in args.presets:
        t: dict[str, list[float]] = {p: [] for p in PRECISIONS}
        for _ in range(args.rounds):
            for p in PRECISIONS:
                t[p] += run(preset, p, args.batch, args.seq, args.warmup, args.steps)
        tps = {p: args.batch * args.seq / statistics.median(v) for p, v in t.items()}
        print(f"{preset}: " + " | ".join(f"{p} {tps[p]:,.0f} tok/s" for p in PRECISIONS)
              + f"   (median of {len(t['fp32'])} steps each)")
        print(f"{preset}: ratio bf16-mixed/fp32 = {tps['bf16-mixed'] / tps['fp32']:.2f}, "
              f"bf16-true/fp32 = {tps['bf16-true'] / tps['fp32']:.2f}", flush=True)


if __name__ == "__main__":
    main()
