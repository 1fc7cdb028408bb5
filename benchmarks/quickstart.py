"""The quickstart's time and quality, idle and under load, beside HF transformers trained
the same way.

Runs `astrai quickstart` as a user does (default recipe, steps sized to its time budget),
once on the machine as it is and once with a CPU-burning process beside it (half of a
2-core machine). After each, trains the transformers model of the same architecture
(LlamaForCausalLM, or Qwen3ForCausalLM when the recipe normalises q and k) on the
quickstart's own packed rows for the same number of optimizer steps with the run's recipe,
read from its train_config.json: batch, torch's AdamW (weight decay on matrices only) or
torch.optim.Muon on the hidden matrices + AdamW on the rest, linear warmup + cosine,
clipping. The peer starts from astrai's initial weights for the run's seed and reads the
rows in astrai's order, so the two runs differ in the stacks' code (model, optimizers,
kernels), not in the luck of a seed's draw. Both models' validation bits per byte are counted
here by one function (summed next-token NLL in float64 / ln 2 / UTF-8 bytes of the
predicted tokens), not by either side's training loop.

    python benchmarks/quickstart.py                 # idle, then loaded, each with its peer
    python benchmarks/quickstart.py --mode idle     # one of them
    python benchmarks/quickstart.py --steps 100     # a fixed step count (quicker check)

Targets on 2 CPU cores: the whole quickstart within 300 s, at most 2.30 bits per byte idle
and at most 2.60 with the burner beside it; the peer shows what the same recipe reaches
in another stack (ratio >= 1: astrai as good or better).
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
from typing import Self

import torch
from peers import hf_causal_lm  # benchmarks/peers.py

REPO = Path(__file__).resolve().parents[1]
TARGETS = {"idle": 2.30, "loaded": 2.60}
"""Validation bits per byte the quickstart promises within 300 s on 2 CPU cores: idle, and
with half the CPU taken by another process."""
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
    from astrai.data.bpb import token_byte_lengths

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


HF_HIDDEN = (".self_attn.q_proj.", ".self_attn.k_proj.", ".self_attn.v_proj.",
             ".self_attn.o_proj.", ".mlp.gate_proj.", ".mlp.up_proj.", ".mlp.down_proj.")


def peer_optimizer(model, recipe: dict) -> list[torch.optim.Optimizer]:
    """The run's optimizer recipe with torch's own optimizers on the HF model's names:
    AdamW (decay on matrices, not on embeddings, norms, biases), or torch.optim.Muon on
    the blocks' q/k/v/o and gate/up/down matrices plus that AdamW on the rest."""
    wd = recipe["weight_decay"]
    adam = {"lr": recipe["max_lr"], "betas": (recipe["adam_beta1"], recipe["adam_beta2"]),
            "eps": recipe["adam_eps"]}
    hidden, decay, no_decay = [], [], []
    for name, p in model.named_parameters():
        if recipe["optimizer"] == "muon" and p.ndim == 2 and any(h in name for h in HF_HIDDEN):
            hidden.append(p)
        elif p.ndim >= 2 and "embed_tokens" not in name:
            decay.append(p)
        else:
            no_decay.append(p)
    groups = [g for g in ({"params": decay, "weight_decay": wd},
                          {"params": no_decay, "weight_decay": 0.0}) if g["params"]]
    opts = [torch.optim.AdamW(groups, **adam, fused=True)]
    if hidden:
        opts.append(torch.optim.Muon(hidden, lr=recipe["muon_lr"], weight_decay=wd,
                                     momentum=recipe["muon_momentum"],
                                     adjust_lr_fn=recipe["muon_adjust_lr"]))
    return opts


def start_like_astrai(hf, config, seed: int) -> None:
    """Give the HF model astrai's initial weights for `config` and `seed` (the draw the
    quickstart's run started from), by the exporter's name map; a tied head is HF's own."""
    from astrai.model.hf_names import astrai_to_hf_name
    from astrai.model.init import build_model

    state = {astrai_to_hf_name(k): v for k, v in build_model(config, seed=seed).state_dict()
             .items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if config.tie_embeddings else set()
    if unexpected or set(missing) - tied:
        sys.exit(f"peer init: missing {missing}, unexpected {unexpected}")


def batch_order(n_rows: int, batch: int, steps: int, seed: int) -> list[list[int]]:
    """The rows of each of `steps` batches in the order astrai's trainer reads them: the
    seeded permutation of each epoch (astrai.data.rdsampler), cut into batches, the last one
    of an epoch shorter."""
    from astrai.data.rdsampler import RDSampler

    sampler, batches, epoch = RDSampler(n_rows, seed=seed), [], 0
    while len(batches) < steps:
        order = sampler.epoch_order(epoch).tolist()
        batches += [order[i:i + batch] for i in range(0, len(order), batch)]
        epoch += 1
    return batches[:steps]


def train_peer(model, data_dir: Path, recipe: dict, *, steps: int, seed: int) -> float:
    """The quickstart's recipe in a plain loop over the same rows in the same order;
    returns training seconds."""
    from astrai.data.dataset import open_dataset
    from astrai.train.schedule import cosine_rate

    data = open_dataset(data_dir, "train")
    opts = peer_optimizer(model, recipe)
    for opt in opts:
        for g in opt.param_groups:
            g["base_lr"] = g["lr"]
    warmup, min_rate = recipe["warmup_steps"], recipe["min_lr"] / recipe["max_lr"]
    batches = batch_order(len(data), recipe["batch_size"], steps, seed)
    model.train()
    t = time.perf_counter()
    for step, idx in enumerate(batches):
        rows = [data[i] for i in idx]
        x, y = pad(rows)
        rate = cosine_rate(step, warmup=warmup, total=steps, min_rate=min_rate)
        for opt in opts:
            for g in opt.param_groups:
                g["lr"] = g["base_lr"] * rate
        logits = model(input_ids=x).logits  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(),
                                                 ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe["max_grad_norm"])
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t


class CpuBurner:
    """One busy-looping process beside the run: on 2 cores it takes half the CPU, as
    another user's job would."""

    def __enter__(self) -> Self:
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()


def recipe_of(run_dir: Path) -> dict:
    """The optimizer recipe the quickstart trained with, from its run's train_config.json."""
    from astrai.config.train import TrainConfig

    c = TrainConfig.from_dict(json.loads((run_dir / "train_config.json").read_text()))
    o = c.optimizer
    keys = ("max_lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "max_grad_norm",
            "muon_momentum", "muon_adjust_lr")
    return {**{k: getattr(o, k) for k in keys}, "optimizer": o.name,
            "batch_size": c.batch_size, "seed": c.seed,
            "warmup_steps": c.schedule.warmup_steps, "min_lr": o.min_lr_value,
            "muon_lr": o.muon_lr_value if o.name == "muon" else None}


def measure(label: str, target: float, extra: list[str], out: Path | None, reuse: Path | None,
            tmp: Path) -> None:
    """One quickstart (or a finished one) and the HF peer trained on its rows with its
    recipe for its steps; prints the lines run_all.py parses, prefixed by `label`."""
    from astrai.model.checkpoint import load_checkpoint

    out = out or tmp / label
    if reuse is not None:
        s = json.loads((reuse / "summary.json").read_text())
        wall = float(s["total_s"])
    elif label == "loaded":
        with CpuBurner():
            s, wall = quickstart(out, extra)
    else:
        s, wall = quickstart(out, extra)
    ckpt, data_dir, tok_dir = Path(s["checkpoint"]), Path(s["dataset"]), Path(s["tokenizer"])
    threads = int(s["threads"])
    torch.set_num_threads(threads)  # the peer gets the threads the quickstart chose

    model, _, _ = load_checkpoint(ckpt)
    ours, n_bytes = val_bpb(lambda x: model(x).logits, data_dir, tok_dir)

    steps = int(s["steps"])
    recipe = recipe_of(Path(s["run_dir"]))
    hf = hf_causal_lm(model.config, recipe["seed"])
    start_like_astrai(hf, model.config, recipe["seed"])
    peer_name = type(hf).__name__
    peer_train_s = train_peer(hf, data_dir, recipe, steps=steps, seed=recipe["seed"])
    hf.eval()
    peer, _ = val_bpb(lambda x: hf(input_ids=x).logits, data_dir, tok_dir)

    c = model.config
    train_s = float(s["stage_s"]["train"])
    print(f"[{label}] quickstart: {s['params']:,} parameters (dim {c.dim}, {c.n_layers} layers"
          f"{', qk_norm' if c.qk_norm else ''}), {steps} steps of {recipe['batch_size']} x "
          f"{c.max_seq_len} tokens, {s['consumed_tokens']:,} tokens, {recipe['optimizer']}, "
          f"{threads} threads"
          + ("" if s.get("fallback_from_steps") is None else
             f"; the fallback model: the recipe's would get {s['fallback_from_steps']} steps"))
    print(f"[{label}] quickstart wall: {wall:.0f} s (summary total {s['total_s']:.0f} s; stages "
          + ", ".join(f"{k} {v:.0f}" for k, v in s["stage_s"].items())
          + f"); target <= 300 s: {'met' if wall <= 300 else 'MISSED'}")
    print(f"[{label}] astrai val_bpb: {ours:.4f} (the quickstart reported {s['val_bpb']:.4f}) "
          f"on {n_bytes:,} bytes; target <= {target:.2f}: {'met' if ours <= target else 'MISSED'}")
    print(f"[{label}] HF val_bpb: {peer:.4f} ({peer_name}, same recipe) after the same "
          f"{steps} steps")
    print(f"[{label}] training seconds: astrai {train_s:.1f} s (with validation), HF "
          f"{peer_train_s:.1f} s")
    print(f"[{label}] ratio HF/astrai: bits per byte {peer / ours:.3f} (> 1: astrai lower), "
          f"training time {peer_train_s / train_s:.2f} (> 1: astrai faster)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=None,
                    help="pass --steps to the quickstart (default: sized to its budget)")
    ap.add_argument("--mode", choices=["idle", "loaded", "both"], default="both",
                    help="idle: the machine as it is; loaded: with a CPU-burning process "
                    "beside the quickstart (default: both, idle first)")
    ap.add_argument("--out", type=Path, default=None, help="keep the quickstart here")
    ap.add_argument("--reuse", type=Path, default=None,
                    help="a finished quickstart directory: train only the peer against it "
                    "(its recorded total seconds stand for the wall time)")
    args = ap.parse_args(argv)
    extra = [] if args.steps is None else ["--steps", str(args.steps)]
    modes = ["idle", "loaded"] if args.mode == "both" else [args.mode]
    print(f"machine: {os.cpu_count()} CPUs, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            measure(mode, TARGETS[mode], extra, args.out if len(modes) == 1 else None,
                    args.reuse, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
