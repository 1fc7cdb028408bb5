"""Scale-out throughput: astrai's ddp/fsdp executors vs one process and vs a plain
torch DDP loop (the peer: what a hand-written DDP script gets on the same machine).

Same preset, random token rows, global batch, AdamW, clipping and dtype for all. The
N-process runs start through astrai's launcher (torch's elastic agent, in-process); each
worker gets cores / N threads, the one-process run gets all cores, so the comparison is
"this machine, one process or N". Figures are tokens/s over the timed steps (after warm-up),
summed over ranks; MFU is against the matmul peak measured here (x world size).

    python benchmarks/train_distributed.py                                   # CPU, tiny, 2 procs
    python benchmarks/train_distributed.py --presets tiny small --nprocs 2 --steps 8
    python benchmarks/train_distributed.py --device cuda --precision bf16-mixed \\
        --presets small 125m --nprocs 1 --compile none block --batch 8 --seq 1024

Prints one line per configuration and the ratios astrai-ddp / plain-DDP and N-process /
one-process (scaling). On a 2-core CPU, expect scaling well below 2: both processes share
the same two cores and the memory bus, and gloo all-reduces go through the kernel.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from astrai.config.train import TrainConfig
from astrai.model import build_model, get_preset
from astrai.model.stats import flops_per_token
from astrai.train import train
from astrai.train.callbacks import Callback
from astrai.train.data import TrainData
from astrai.train.flops import measure_peak_flops
from astrai.train.launch import run_workers
from astrai.train.param_groups import decay_param_groups

LR, WD, BETAS = 3e-4, 0.1, (0.9, 0.95)


class Rows(torch.utils.data.Dataset):
    def __init__(self, n: int, T: int, vocab: int) -> None:
        self.tokens = torch.randint(0, vocab, (n, T + 1), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i, :-1], "target_ids": self.tokens[i, 1:]}


def collate(samples):
    return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}


class StepTimes(Callback):
    name = "step_times"

    def __init__(self) -> None:
        self.t: list[float] = []
        self._t0 = 0.0

    def on_train_begin(self, ctx) -> None:
        self._t0 = time.perf_counter()

    def on_step_end(self, ctx, report, control) -> None:
        now = time.perf_counter()
        self.t.append(now - self._t0)
        self._t0 = now


def astrai_run(preset, parallel, B, T, steps, warmup, device, precision, compile_mode):
    """One rank of an astrai run; returns (tokens/s of this rank, world size)."""
    vocab = get_preset(preset).vocab_size
    world = int(__import__("os").environ.get("WORLD_SIZE", "1"))
    data = TrainData(dataset=Rows(B * world * (steps + 1), T, vocab), kind="pretrain",
                     seq_len=T, collate_fn=collate, vocab_size=vocab)
    times = StepTimes()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(model=preset, out=str(Path(tmp) / "run"), batch_size=B,
                          max_steps=steps, ckpt_interval=0, max_lr=LR, weight_decay=WD,
                          warmup_steps=1, device=device, precision=precision,
                          parallel=parallel, compile=compile_mode, peak_tflops=1.0)
        train(cfg, data=data, callbacks=[times])
    return B * T / statistics.median(times.t[warmup:]), world


def plain_ddp_run(preset, B, T, steps, warmup, device):
    """The peer: a hand-written torch DDP loop (forward, loss, backward, clip, AdamW)."""
    import os

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    cuda = device.startswith("cuda")
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    cfg = get_preset(preset)
    model = DistributedDataParallel(build_model(cfg, seed=0).to(dev),
                                    device_ids=[dev.index] if cuda else None)
    opt = torch.optim.AdamW(decay_param_groups(model.module, WD), lr=LR, betas=BETAS)
    x = torch.randint(0, cfg.vocab_size, (B, T + 1), device=dev)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        logits = model(x[:, :-1]).logits
        F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    return B * T / statistics.median(times[warmup:]), dist_world()


def dist_world() -> int:
    import os

    return int(os.environ.get("WORLD_SIZE", "1"))


def total(results: dict[int, tuple[float, int]]) -> float:
    return sum(tps for tps, _ in results.values())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["tiny"])
    ap.add_argument("--nprocs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8, help="global batch (split over ranks)")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--compile", nargs="+", default=["none"], dest="compile_modes")
    args = ap.parse_args(argv)
    n, B, T = args.nprocs, args.batch, args.seq
    if B % n:
        sys.exit(f"--batch {B} must be a multiple of --nprocs {n}")
    dtype = torch.bfloat16 if args.precision.startswith("bf16") else torch.float32
    peak = measure_peak_flops(args.device, dtype)
    print(f"device {args.device}, {torch.get_num_threads()} threads, {args.precision}; "
          f"matmul peak {peak / 1e12:.3f} TFLOP/s per device; global batch {B} x {T} tokens")
    for preset in args.presets:
        fpt = flops_per_token(get_preset(preset), T, training=True)
        for comp in args.compile_modes:
            common = (B, T, args.steps, args.warmup, args.device, args.precision, comp)
            one = astrai_run(preset, "none", *common)[0]
            line = {"1 process": one}
            if n > 1:
                per = (B // n, *common[1:])
                line[f"astrai ddp x{n}"] = total(run_workers(
                    astrai_run, (preset, "ddp", *per), nprocs=n))
                line[f"astrai fsdp x{n}"] = total(run_workers(
                    astrai_run, (preset, "fsdp", *per), nprocs=n))
                if comp == "none":
                    line[f"plain DDP x{n}"] = total(run_workers(
                        plain_ddp_run, (preset, B // n, T, args.steps, args.warmup,
                                        args.device), nprocs=n))
            world = {k: (n if "x" in k else 1) for k in line}
            cells = [f"{k} {v:,.0f} tok/s (MFU {v * fpt / (peak * world[k]):.1%})"
                     for k, v in line.items()]
            print(f"{preset} compile={comp}: " + " | ".join(cells))
            if n > 1:
                ddp = line[f"astrai ddp x{n}"]
                ratios = [f"ddp/1-process {ddp / one:.2f}",
                          f"fsdp/1-process {line[f'astrai fsdp x{n}'] / one:.2f}"]
                if f"plain DDP x{n}" in line:
                    ratios.append(f"astrai-ddp/plain-DDP {ddp / line[f'plain DDP x{n}']:.2f}")
                print("  " + ", ".join(ratios))


if __name__ == "__main__":
    main()
