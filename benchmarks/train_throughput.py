"""Training throughput: astrai's Trainer vs HF transformers' LlamaForCausalLM and a plain loop.

Same shapes (a preset), same data (random token rows), same batch, optimizer (AdamW, decay
on matrices), gradient clipping, fp32 on CPU and thread count; HF uses sdpa attention.
Rounds are interleaved (astrai, hf, plain, astrai, ...) so a busy machine slows all three
alike; the median and the best round of tokens/s over the timed steps are printed (on a
shared machine the best round is the one least disturbed).

    python benchmarks/train_throughput.py                        # tiny and small presets
    python benchmarks/train_throughput.py --presets tiny --rounds 5 --threads 2

Prints tokens/s, the astrai/HF and astrai/plain ratios, and MFU against the fp32 matmul peak
measured on this machine (astrai.train.flops.measure_peak_flops, 2048^3 matmuls).
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
from astrai.train.optim import decay_param_groups

LR, WD, BETAS = 3e-4, 0.1, (0.9, 0.95)


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


class StepTimes(Callback):
    name = "step_times"

    def __init__(self) -> None:
        self.t: list[float] = []

    def on_step_end(self, ctx) -> None:
        self.t.append(time.perf_counter())


def run_astrai(preset: str, B: int, T: int, warmup: int, steps: int) -> float:
    """tokens/s of the real Trainer (callbacks, metrics, clipping) between step ends."""
    cfg = get_preset(preset)
    data = Rows(B * (warmup + steps + 1), T, cfg.vocab_size)
    td = TrainData(dataset=data, kind="pretrain", seq_len=T, collate_fn=collate,
                   vocab_size=cfg.vocab_size)
    timer = StepTimes()
    with tempfile.TemporaryDirectory() as tmp:
        config = TrainConfig(model=preset, out=str(Path(tmp) / "run"), batch_size=B,
                             max_lr=LR, weight_decay=WD, warmup_steps=0, ckpt_interval=0,
                             max_steps=warmup + steps + 1, device="cpu", precision="fp32",
                             peak_tflops=1.0)
        train(config, data=td, callbacks=[timer])
    # the last step also writes the final checkpoint: time steps warmup+1 .. warmup+steps
    return B * T * steps / (timer.t[warmup + steps - 1] - timer.t[warmup - 1])


def _loop(model, loss_fn, B: int, T: int, vocab: int, warmup: int, steps: int) -> float:
    opt = torch.optim.AdamW(decay_param_groups(model, WD), lr=LR, betas=BETAS)
    data = Rows(B * (warmup + steps), T, vocab)
    model.train()
    t0 = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            t0 = time.perf_counter()
        batch = collate([data[j] for j in range(i * B, (i + 1) * B)])
        loss = loss_fn(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return B * T * steps / (time.perf_counter() - t0)


def _ce(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def run_plain(preset: str, B: int, T: int, warmup: int, steps: int) -> float:
    """nanoGPT-style loop over the same astrai Transformer: no trainer, no callbacks."""
    cfg = get_preset(preset)
    model = build_model(cfg, seed=0)
    return _loop(model, lambda m, b: _ce(m(b["input_ids"]).logits, b["target_ids"]),
                 B, T, cfg.vocab_size, warmup, steps)


def run_hf(preset: str, B: int, T: int, warmup: int, steps: int) -> float:
    from transformers import LlamaConfig, LlamaForCausalLM

    c = get_preset(preset)
    hf = LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.dim, intermediate_size=c.ffn_dim,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
        num_key_value_heads=c.kv_heads, head_dim=c.hdim, max_position_embeddings=c.max_seq_len,
        rms_norm_eps=c.norm_eps, rope_theta=c.rope_theta, tie_word_embeddings=c.tie_embeddings,
        attention_bias=False, mlp_bias=False,
    )
    hf._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(hf)
    model.config.use_cache = False
    return _loop(model, lambda m, b: _ce(m(input_ids=b["input_ids"]).logits, b["target_ids"]),
                 B, T, c.vocab_size, warmup, steps)


RUNNERS = {"astrai": run_astrai, "hf": run_hf, "plain": run_plain}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=0, help="timed steps (0 = 8 tiny, 3 others)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    peak = measure_peak_flops("cpu", torch.float32, n=2048, seconds=1.0)
    print(f"threads {args.threads}; fp32 matmul peak {peak / 1e9:.1f} GFLOP/s; "
          f"batch {args.batch} x {args.seq}", flush=True)
    for preset in args.presets:
        steps = args.steps or (8 if preset == "tiny" else 3)
        fpt = flops_per_token(get_preset(preset), args.seq, training=True)
        res: dict[str, list[float]] = {k: [] for k in RUNNERS}
        for r in range(args.rounds):
            for name, fn in RUNNERS.items():
                res[name].append(fn(preset, args.batch, args.seq, args.warmup, steps))
                print(f"  {preset} round {r + 1} {name}: {res[name][-1]:,.0f} tok/s",
                      file=sys.stderr, flush=True)
        for label, agg in (("median", statistics.median), ("best", max)):
            v = {k: agg(x) for k, x in res.items()}
            print(f"{preset} ({label} of {args.rounds}): astrai {v['astrai']:,.0f} tok/s "
                  f"(MFU {v['astrai'] * fpt / peak:.1%}) | HF Llama {v['hf']:,.0f} tok/s "
                  f"(MFU {v['hf'] * fpt / peak:.1%}) | plain loop {v['plain']:,.0f} tok/s | "
                  f"ratio astrai/HF = {v['astrai'] / v['hf']:.2f}, "
                  f"astrai/plain = {v['astrai'] / v['plain']:.2f}", flush=True)


if __name__ == "__main__":
    main()
