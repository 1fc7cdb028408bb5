"""Training throughput: astrai's Trainer vs HF transformers' LlamaForCausalLM and a plain loop.

Same shapes (a preset), same data (random token rows), same batch, optimizer (AdamW, decay
on matrices), gradient clipping, fp32 on CPU and thread count; HF uses sdpa attention.
Steps are interleaved (an astrai step, then one HF step and one plain step, from a callback)
so a busy machine slows all three alike; the ratios are medians of per-step time ratios, and
the median and best per-step tokens/s are printed too.

    python benchmarks/train_throughput.py                        # tiny and small presets
    python benchmarks/train_throughput.py --presets tiny --steps 20 --threads 2

Prints tokens/s, the astrai/HF and astrai/plain ratios, and MFU (PaLM FLOPs per token,
astrai.model.stats) against the best fp32 2048^3 matmul rate seen on this machine, at start
and between steps.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from peers import hf_llama  # benchmarks/peers.py

from astrai.config.train import TrainConfig
from astrai.model import build_model, get_preset
from astrai.model.stats import flops_per_token
from astrai.train import train
from astrai.train.callbacks import Callback
from astrai.train.data import TrainData
from astrai.train.flops import measure_peak_flops
from astrai.train.param_groups import decay_param_groups

LR, WD, BETAS = 3e-4, 0.1, (0.9, 0.95)
CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter


class Rows(torch.utils.data.Dataset):
    def __init__(self, n: int, T: int, vocab: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab, (n, T + 1), generator=g)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = self.tokens[i]
        return {"input_ids": row[:-1], "target_ids": row[1:]}


def collate(samples):
    return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}


class Interleave(Callback):
    """Times each astrai step (end of the previous step -> on_step_end: data loading and
    every callback included), then takes one step of every
    peer, so the three alternate step by step and a busy machine slows them alike."""

    name = "interleave"

    def __init__(self, peers: dict) -> None:
        self.peers = peers
        self.times: dict[str, list[float]] = {"astrai": [], **{k: [] for k in peers}}
        self.peak = 0.0
        self._a, self._b = torch.randn(2048, 2048), torch.randn(2048, 2048)

    def on_step_end(self, ctx, report, control) -> None:
        self.times["astrai"].append(clock() - self.start)
        for name, step in self.peers.items():
            t = clock()
            step(ctx.state.step - 1)
            self.times[name].append(clock() - t)
        # the matmul peak, sampled between steps too: the best one seen is the machine's
        t = time.perf_counter()
        self._a @ self._b
        self.peak = max(self.peak, 2 * 2048**3 / (time.perf_counter() - t))
        self.start = clock()  # the next astrai step (data loading included) starts now

    def on_train_begin(self, ctx) -> None:
        self.start = clock()


def _ce(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def peer_step(model, forward, data: Rows, B: int):
    """One plain training step (forward, loss, backward, clip, AdamW) of `model`."""
    opt = torch.optim.AdamW(decay_param_groups(model, WD), lr=LR, betas=BETAS)
    model.train()

    def step(i: int) -> None:
        batch = collate([data[j] for j in range(i * B, (i + 1) * B)])
        _ce(forward(model, batch["input_ids"]), batch["target_ids"]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def run(preset: str, B: int, T: int, warmup: int, steps: int
        ) -> tuple[dict[str, list[float]], float]:
    """Seconds per step of astrai's Trainer (callbacks, metrics, clipping), HF Llama and a
    nanoGPT-style loop over the astrai Transformer, interleaved; warmup steps dropped."""
    cfg = get_preset(preset)
    n = warmup + steps + 1
    data = Rows(B * n, T, cfg.vocab_size)
    peers = {
        "hf": peer_step(hf_llama(get_preset(preset)), lambda m, x: m(input_ids=x).logits, data, B),
        "plain": peer_step(build_model(cfg, seed=0), lambda m, x: m(x).logits, data, B),
    }
    timer = Interleave(peers)
    td = TrainData(dataset=data, kind="pretrain", seq_len=T, collate_fn=collate,
                   vocab_size=cfg.vocab_size)
    with tempfile.TemporaryDirectory() as tmp:
        config = TrainConfig(model=preset, out=str(Path(tmp) / "run"), batch_size=B,
                             max_lr=LR, weight_decay=WD, warmup_steps=0, ckpt_interval=0,
                             max_steps=n, device="cpu", precision="fp32", peak_tflops=1.0)
        train(config, data=td, callbacks=[timer])
    # drop warmup; the last astrai step also wrote the final checkpoint after its timing
    return {k: v[warmup:] for k, v in timer.times.items()}, timer.peak


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=0, help="timed steps (0 = 12 tiny, 4 others)")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved runs, steps pooled")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--clock", choices=list(CLOCK), default="wall",
                    help="wall time, or this process's CPU time (with --threads 1 it is "
                         "barely touched by other processes on a shared machine)")
    args = ap.parse_args(argv)
    global clock
    clock = CLOCK[args.clock]
    torch.set_num_threads(args.threads)
    peak = measure_peak_flops("cpu", torch.float32, n=2048, seconds=1.0)
    print(f"threads {args.threads}, {args.clock} clock; fp32 matmul at start "
          f"{peak / 1e9:.1f} GFLOP/s; "
          f"batch {args.batch} x {args.seq}", flush=True)
    for preset in args.presets:
        steps = args.steps or (12 if preset == "tiny" else 4)
        fpt = flops_per_token(get_preset(preset), args.seq, training=True)
        t: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            times, seen = run(preset, args.batch, args.seq, args.warmup, steps)
            peak = max(peak, seen)
            for k, v in times.items():
                t.setdefault(k, []).extend(v)
        tps = {k: [args.batch * args.seq / x for x in v] for k, v in t.items()}
        med = {k: statistics.median(v) for k, v in tps.items()}
        best = {k: max(v) for k, v in tps.items()}
        ratio_hf = statistics.median(h / a for a, h in zip(t["astrai"], t["hf"], strict=True))
        ratio_pl = statistics.median(p / a for a, p in zip(t["astrai"], t["plain"], strict=True))
        n = len(t["astrai"])
        print(f"{preset}: astrai {med['astrai']:,.0f} tok/s (MFU {med['astrai'] * fpt / peak:.1%})"
              f" | HF Llama {med['hf']:,.0f} tok/s (MFU {med['hf'] * fpt / peak:.1%})"
              f" | plain loop {med['plain']:,.0f} tok/s   (median of {n} steps)")
        print(f"{preset} best steps -- astrai {best['astrai']:,.0f}, HF Llama {best['hf']:,.0f},"
              f" plain loop {best['plain']:,.0f} tok/s; MFU peak = best fp32 matmul seen, "
              f"{peak / 1e9:.1f} GFLOP/s")
        print(f"{preset}: ratio astrai/HF = {ratio_hf:.2f}, astrai/plain = {ratio_pl:.2f} "
              "(median of the per-step time ratios)", flush=True)


if __name__ == "__main__":
    main()
