"""LoRA vs full fine-tuning with astrai's Trainer, and astrai LoRA vs HF transformers + PEFT.

Same preset, data (random token rows, loss on every token), batch, AdamW, clipping, fp32
on CPU. Two astrai runs (LoRA, then full fine-tuning), each with a plain HF transformers +
PEFT training loop (`get_peft_model` on LlamaForCausalLM of the same shape, same rank and
targets) stepped between astrai's steps, so a busy machine slows both alike.

    python benchmarks/lora.py                          # small preset, rank 8, all-linear
    python benchmarks/lora.py --preset tiny --steps 4

Prints trainable parameters and optimizer-state bytes (LoRA vs full, after the first step),
the median step time of each run, tokens/s against HF + PEFT (median of per-step ratios) and
the LoRA/full step-time ratio (each normalised by the HF + PEFT loop of its own run).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
from peers import hf_llama  # benchmarks/peers.py
from train_throughput import Interleave, Rows, collate, peer_step  # benchmarks/

from astrai.config.train import TrainConfig
from astrai.model import get_preset
from astrai.model.lora import TARGETS
from astrai.train import train
from astrai.train.callbacks import Callback
from astrai.train.data import TrainData

LR, WD = 3e-4, 0.1


class Footprint(Callback):
    """Trainable parameters and optimizer-state bytes after the first step."""

    name = "footprint"

    def on_step_end(self, ctx, report, control) -> None:
        if ctx.state.step != 1:
            return
        self.trainable = sum(p.numel() for p in ctx.model.parameters() if p.requires_grad)
        self.total = sum(p.numel() for p in ctx.model.parameters())
        self.state_bytes = sum(t.numel() * t.element_size()
                               for s in ctx.optimizer.state.values() for t in s.values()
                               if torch.is_tensor(t) and t.dim() > 0)


def peft_step(preset: str, rank: int, data: Rows, B: int):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(hf_llama(get_preset(preset)), LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=list(TARGETS), task_type="CAUSAL_LM"))
    return peer_step(model, lambda m, x: m(input_ids=x).logits, data, B)


def run(preset: str, rank: int | None, B: int, T: int, warmup: int, steps: int):
    cfg = get_preset(preset)
    n = warmup + steps + 1
    data = Rows(B * n, T, cfg.vocab_size)
    timer = Interleave({"hf_peft": peft_step(preset, rank or 8, data, B)})
    foot = Footprint()
    td = TrainData(dataset=data, kind="pretrain", seq_len=T, collate_fn=collate,
                   vocab_size=cfg.vocab_size)
    lora = {"lora_rank": rank, "lora_alpha": 2.0 * rank} if rank else {}
    with tempfile.TemporaryDirectory() as tmp:
        config = TrainConfig(model=preset, out=str(Path(tmp) / "run"), batch_size=B,
                             max_lr=LR, weight_decay=WD, warmup_steps=0, ckpt_interval=0,
                             max_steps=n, device="cpu", precision="fp32", peak_tflops=1.0,
                             **lora)
        train(config, data=td, callbacks=[timer, foot])
    return {k: v[warmup:] for k, v in timer.times.items()}, foot


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    p = args.preset
    tl, fl = run(p, args.rank, args.batch, args.seq, args.warmup, args.steps)
    tf, ff = run(p, None, args.batch, args.seq, args.warmup, args.steps)
    tok = args.batch * args.seq
    med = {k: statistics.median(v) for k, v in (("lora", tl["astrai"]), ("full", tf["astrai"]),
                                               ("peft", tl["hf_peft"]))}
    vs_peft = statistics.median(h / a for a, h in zip(tl["astrai"], tl["hf_peft"], strict=True))
    # each run's step time over its own HF + PEFT steps: machine load cancels out
    norm_l = statistics.median(a / h for a, h in zip(tl["astrai"], tl["hf_peft"], strict=True))
    norm_f = statistics.median(a / h for a, h in zip(tf["astrai"], tf["hf_peft"], strict=True))
    print(f"{p} rank {args.rank} all-linear, batch {args.batch} x {args.seq}, "
          f"{args.threads} threads, {len(tl['astrai'])} timed steps per run")
    print(f"{p}: trainable parameters LoRA {fl.trainable:,} | full {ff.trainable:,} | "
          f"ratio {fl.trainable / ff.trainable:.4f}")
    print(f"{p}: optimizer state LoRA {fl.state_bytes:,} B | full {ff.state_bytes:,} B | "
          f"ratio {fl.state_bytes / ff.state_bytes:.4f}")
    print(f"{p}: step time LoRA {med['lora']:.3f} s | full {med['full']:.3f} s | "
          f"ratio {norm_l / norm_f:.2f} (LoRA/full, each over its run's HF+PEFT steps)")
    print(f"{p}: astrai LoRA {tok / med['lora']:,.0f} tok/s | HF+PEFT {tok / med['peft']:,.0f} "
          f"tok/s | ratio astrai/HF+PEFT = {vs_peft:.2f} (median of per-step ratios)",
          flush=True)


if __name__ == "__main__":
    main()
