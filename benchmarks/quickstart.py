"""The quickstart's time and quality, and HF transformers' Llama trained the same way.

Runs `astrai quickstart` as a user does (default recipe, steps sized to its time budget),
then trains HF transformers' LlamaForCausalLM of the same shape on the quickstart's own
packed rows for the same number of optimizer steps with the same recipe: batch, AdamW
(betas, eps, weight decay on matrices only), linear warmup + cosine, clipping at 1.0, a
seeded shuffle each epoch. Both models' validation bits per byte are counted here by one
function (summed next-token NLL in float64 / ln 2 / UTF-8 bytes of the predicted tokens),
not by either side's training loop.

    python benchmarks/quickstart.py                 # the default quickstart, then the peer
    python benchmarks/quickstart.py --steps 100     # a fixed step count (quicker check)

Targets: the whole quickstart in at most 300 s on 2 CPU cores, validation at most
2.6 bits per byte; the peer is there to show what the same recipe reaches in another stack.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from peers import hf_llama  # benchmarks/peers.py

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def quickstart(out: Path, extra: list[str]) -> tuple[dict, float]:
    """Run the CLI as a user would; (summary, wall seconds including interpreter start)."""
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "astrai_cli.main", "quickstart", "--out",
                        str(out), "--json", *extra], capture_output=True, text=True,
                       check=False)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"astrai quickstart failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return json.loads(r.stdout), wall


def val_bpb(forward, data_dir: Path, tokenizer_dir: Path) -> tuple[float, int]:
    """(bits per byte, bytes) of `forward(input_ids (1, T)) -> logits (1, T, V)` on the
    quickstart's val split: every target >= 0 is scored; special tokens carry no bytes."""
    from astrai.data.dataset import open_dataset
    from astrai.train.bpb import token_byte_lengths

    lengths = token_byte_lengths(tokenizer_dir)  # (V,)
    val = open_dataset(data_dir, "val")
    nll, n_bytes = 0.0, 0
    with torch.no_grad():
        for i in range(len(val)):
            row = val[i]
            logits = forward(row["input_ids"][None])[0].double()  # (T, V)
            t = row["target_ids"]
            keep = t >= 0
            nll += float(torch.nn.functional.cross_entropy(logits[keep], t[keep],
                                                           reduction="sum"))
            n_bytes += int(lengths[t[keep]].sum())
    return nll / math.log(2) / n_bytes, n_bytes


def pad(rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (B, T) padded with 0 and targets (B, T) padded with -100 (not scored): the
    last packed row of a split may be short."""
    T = max(len(r["input_ids"]) for r in rows)
    x = torch.zeros(len(rows), T, dtype=torch.long)
    y = torch.full((len(rows), T), -100, dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        x[i, :n], y[i, :n] = r["input_ids"], r["target_ids"]
    return x, y


def train_peer(model, data_dir: Path, *, steps: int, batch: int, max_lr: float, min_lr: float,
               warmup: int, seed: int) -> float:
    """The quickstart's recipe in a plain loop over the same rows; returns training seconds."""
    from astrai.data.dataset import open_dataset
    from astrai.train.optim import decay_param_groups
    from astrai.train.schedule import cosine_rate

    data = open_dataset(data_dir, "train")
    opt = torch.optim.AdamW(decay_param_groups(model, 0.1), lr=max_lr, betas=(0.9, 0.95),
                            eps=1e-8, fused=True)
    gen = torch.Generator().manual_seed(seed)
    order: list[int] = []
    model.train()
    t = time.perf_counter()
    for step in range(steps):
        while len(order) < batch:
            order += torch.randperm(len(data), generator=gen).tolist()
        idx, order = order[:batch], order[batch:]
        rows = [data[i] for i in idx]
        x, y = pad(rows)
        rate = cosine_rate(step, warmup=warmup, total=steps, min_rate=min_lr / max_lr)
        for g in opt.param_groups:
            g["lr"] = max_lr * rate
        logits = model(input_ids=x).logits  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(),
                                                 ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=None,
                    help="pass --steps to the quickstart (default: sized to its budget)")
    ap.add_argument("--out", type=Path, default=None, help="keep the quickstart here")
    ap.add_argument("--reuse", type=Path, default=None,
                    help="a finished quickstart directory: train only the peer against it "
                    "(its recorded total seconds stand for the wall time)")
    args = ap.parse_args(argv)

    from astrai.model.checkpoint import load_checkpoint
    from astrai.quickstart.config import QuickstartConfig

    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp) / "qs"
        extra = [] if args.steps is None else ["--steps", str(args.steps)]
        if args.reuse is not None:
            s = json.loads((args.reuse / "summary.json").read_text())
            wall = float(s["total_s"])
        else:
            s, wall = quickstart(out, extra)
        ckpt, data_dir, tok_dir = Path(s["checkpoint"]), Path(s["dataset"]), Path(s["tokenizer"])
        threads = int(s["threads"])
        torch.set_num_threads(threads)  # the peer gets the threads the quickstart chose

        model, _, _ = load_checkpoint(ckpt)
        ours, n_bytes = val_bpb(lambda x: model(x).logits, data_dir, tok_dir)

        cfg = QuickstartConfig()
        steps = int(s["steps"])
        hf = hf_llama(model.config, cfg.seed)
        peer_train_s = train_peer(hf, data_dir, steps=steps, batch=cfg.batch_size,
                                  max_lr=cfg.max_lr, min_lr=cfg.min_lr,
                                  warmup=min(cfg.warmup_steps, steps // 4), seed=cfg.seed)
        hf.eval()
        peer, _ = val_bpb(lambda x: hf(input_ids=x).logits, data_dir, tok_dir)

    train_s = float(s["stage_s"]["train"])
    print(f"machine: {os.cpu_count()} CPUs, torch {torch.__version__}, {threads} threads")
    print(f"quickstart: {s['params']:,} parameters, {steps} steps of {cfg.batch_size} x "
          f"{cfg.seq_len} tokens, {s['consumed_tokens']:,} tokens")
    print(f"quickstart wall: {wall:.0f} s (summary total {s['total_s']:.0f} s; stages "
          + ", ".join(f"{k} {v:.0f}" for k, v in s["stage_s"].items())
          + f"); target <= 300 s: {'met' if wall <= 300 else 'MISSED'}")
    print(f"astrai val_bpb: {ours:.4f} (the quickstart reported {s['val_bpb']:.4f}) on "
          f"{n_bytes:,} bytes; target <= 2.6: {'met' if ours <= 2.6 else 'MISSED'}")
    print(f"HF Llama val_bpb: {peer:.4f} after the same {steps} steps")
    print(f"training seconds: astrai {train_s:.1f} s (with validation), HF Llama "
          f"{peer_train_s:.1f} s")
    print(f"ratio HF/astrai: bits per byte {peer / ours:.3f} (> 1: astrai lower), "
          f"training time {peer_train_s / train_s:.2f} (> 1: astrai faster)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
