"""Checkpoint saves as the model grows: full-state (gathered to rank 0) against DCP (each rank
writes its shards), blocking and asynchronous, under `--parallel fsdp` on N processes.

    python benchmarks/checkpoint_save.py                         # tiny small 125m, 2 procs, CPU
    python benchmarks/checkpoint_save.py --presets tiny --rounds 1

For each preset and format (full, dcp, dcp-async, and "none": no saves but the one every run
makes when it ends, the step-time baseline), a run of `--steps` fsdp steps saves every
`--every` steps. Measured in each rank: the wall time of each
save call (for dcp-async the blocking part; the write goes on beside the next steps), rank 0's
peak resident memory during its save calls above what it held just before (sampled every
2 ms from /proc/self/statm), and the median step time (the cost an async save leaves on the
steps it overlaps). Rounds are interleaved (every format once per round, in a seeded
shuffled order); printed: the median over rounds with min–max, the load average before and
after, and the ratios dcp / full for save time and rank-0 memory. The peer is astrai's own
full-state save (torch's `get_model_state_dict(full_state_dict=True, cpu_offload=True)`, what
torchtitan replaced with DCP for the same reason).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch
from train_distributed import Rows, StepTimes, collate  # benchmarks/train_distributed.py

from astrai.config.train import TrainConfig
from astrai.model import build_model, get_preset
from astrai.train import train
from astrai.train.data import TrainData
from astrai.train.launch import run_workers

FORMATS = ("none", "full", "dcp", "dcp-async")
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class SaveProbe:
    """Wraps Trainer.save: each call's wall time and the peak RSS above the RSS before it."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.peak_extra: list[int] = []

    def install(self) -> None:
        from astrai.train import trainer

        original = trainer.Trainer.save
        probe = self

        def save(self_) -> None:
            before, peak, stop = rss(), [0], threading.Event()

            def sample() -> None:
                while not stop.is_set():
                    peak[0] = max(peak[0], rss())
                    stop.wait(0.002)

            t = threading.Thread(target=sample, daemon=True)
            t.start()
            t0 = time.perf_counter()
            try:
                original(self_)
            finally:
                probe.seconds.append(time.perf_counter() - t0)
                stop.set()
                t.join()
                probe.peak_extra.append(max(0, max(peak[0], rss()) - before))

        trainer.Trainer.save = save


def run(preset: str, fmt: str, B: int, T: int, steps: int, every: int) -> dict:
    """One rank of one run; its save times, rank-0 memory and step times."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    vocab = get_preset(preset).vocab_size
    data = TrainData(dataset=Rows(B * world * (steps + 1), T, vocab), kind="pretrain",
                     seq_len=T, collate_fn=collate, vocab_size=vocab)
    probe, times = SaveProbe(), StepTimes()
    probe.install()
    ckpt = {} if fmt == "none" else {
        "ckpt_interval": every, "checkpoint_format": "full" if fmt == "full" else "dcp",
        "async_checkpoint": fmt == "dcp-async"}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(model=preset, out=str(Path(tmp) / "run"), batch_size=B,
                          max_steps=steps, max_lr=3e-4, warmup_steps=1, device="cpu",
                          precision="fp32", parallel="fsdp", peak_tflops=1.0,
                          **({"ckpt_interval": 0} if fmt == "none" else ckpt))
        train(cfg, data=data, callbacks=[times])
    return {"save_s": statistics.median(probe.seconds) if probe.seconds else 0.0,
            "peak_mib": max(probe.peak_extra, default=0) / 2**20,
            "step_s": statistics.median(times.t[1:])}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["tiny", "small", "125m"])
    ap.add_argument("--nprocs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2, help="per-rank batch")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    print(f"{args.nprocs} processes, fsdp, CPU/gloo, {os.cpu_count()} cores; load average "
          f"{os.getloadavg()[0]:.2f} before")
    rng = random.Random(0)
    res: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.rounds):
        for preset in args.presets:
            order = list(FORMATS)
            rng.shuffle(order)
            for fmt in order:
                ranks = run_workers(run, (preset, fmt, args.batch, args.seq, args.steps,
                                          args.every), nprocs=args.nprocs)
                res.setdefault((preset, fmt), []).append(ranks[0])
    for preset in args.presets:
        n = sum(p.numel() for p in build_model(get_preset(preset), seed=0).parameters())
        print(f"{preset} ({n / 1e6:.1f}M parameters):")
        for fmt in FORMATS:
            rows = res[(preset, fmt)]
            cells = []
            keys = ((("save_s", "s save"), ("peak_mib", "MiB rank-0 peak")) if fmt != "none"
                    else ()) + (("step_s", "s/step"),)
            for key, unit in keys:
                v = [r[key] for r in rows]
                cells.append(f"{statistics.median(v):.3f} {unit} [{min(v):.3f}-{max(v):.3f}]")
            print(f"  {fmt:10s} " + " | ".join(cells))
        full, dcp = res[(preset, "full")], res[(preset, "dcp")]
        med = lambda rows, k: statistics.median(r[k] for r in rows)
        print(f"  ratio dcp/full: save time {med(dcp, 'save_s') / med(full, 'save_s'):.2f}, "
              f"rank-0 peak memory {med(dcp, 'peak_mib') / max(med(full, 'peak_mib'), 1e-9):.2f}"
              f"; async step time / no checkpoints "
              f"{med(res[(preset, 'dcp-async')], 'step_s') / med(res[(preset, 'none')], 'step_s'):.2f}"
              f", blocking dcp {med(dcp, 'step_s') / med(res[(preset, 'none')], 'step_s'):.2f}")
    print(f"load average {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
