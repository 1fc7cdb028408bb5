"""bf16-true weight updates against fp32 master weights: quality, memory, speed.

    python benchmarks/bf16_update.py                       # 3 seeds, ~4 min on 2 CPU cores
    python benchmarks/bf16_update.py --seeds 5 --steps 600 --lr 3e-5
    python benchmarks/bf16_update.py --seeds 1 --keep runs/   # then inspect-weights them

The same tiny byte-level Llama (vocabulary 256, so the loss per token in bits is bits per
byte), the same data (the public-domain corpus astrai ships, astrai/assets/tiny_corpus.txt,
its last 10% held out) and the same steps, under fp32, bf16-mixed (fp32 weights, bf16
autocast) and bf16-true with each --bf16-update mode: nearest, stochastic and kahan, the
bf16-true runs with bf16 AdamW moments (the configuration whose memory the modes exist
to save). Every run is repeated over `--seeds` (model init and data order), and the seed
spread of bf16-mixed is printed beside the 1% criterion, so a difference can be read
against noise.

Per mode: validation bits per byte (weights upcast to fp32 for the evaluation, so only
what training stored is compared), the weights' lock-in count (inspect-weights' check),
the entries that did not change over the second half of training (the dead zone at
work), bytes per parameter (weights + gradients + optimizer state: the accounting of
`astrai train --dry-run`) and training tokens/s. Ratios are against bf16-mixed.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch

from astrai.config.train import TrainConfig
from astrai.inspect.guard import check_lockin
from astrai.train import train
from astrai.train.callbacks import Callback
from astrai.train.data import TrainData
from astrai.train.plan import bytes_per_param

CORPUS = Path(__file__).resolve().parent.parent / "astrai" / "assets" / "tiny_corpus.txt"
MODES = (("fp32", "nearest"), ("bf16-mixed", "nearest"), ("bf16-true", "nearest"),
         ("bf16-true", "stochastic"), ("bf16-true", "kahan"))
MODEL = {"dim": 64, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16,
         "ffn_dim": 192, "max_seq_len": 128, "vocab_size": 256}


class Windows(torch.utils.data.Dataset):
    """Consecutive byte windows of length T + 1."""

    def __init__(self, data: torch.Tensor, T: int) -> None:
        n = (len(data) - 1) // T
        self.rows = data[: n * T + 1].unfold(0, T + 1, T)[:n] if n else data[:0]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        r = self.rows[i].long()
        return {"input_ids": r[:-1], "target_ids": r[1:]}


def collate(samples):
    return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}


class Watch(Callback):
    """Copies the weights at the middle step; at the end, keeps the trained model."""

    name = "watch"

    def __init__(self, mid: int) -> None:
        self.mid, self.half, self.model, self.start, self.end = mid, None, None, 0.0, 0.0

    def on_train_begin(self, ctx) -> None:
        self.start = time.perf_counter()

    def on_step_end(self, ctx, report, control) -> None:
        if report.step == self.mid:
            self.half = {n: p.detach().clone() for n, p in ctx.model.named_parameters()}

    def on_train_end(self, ctx) -> None:
        self.end = time.perf_counter()
        self.model = ctx.model


class Plant(Callback):
    """After step `at`, pins rows 0-1 of every k_proj and row 0 of every down_proj to
    exactly 1.0: the paper's pattern, where a gradient spike had thrown those weights."""

    name = "plant"

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, ctx, report, control) -> None:
        if report.step == self.at:
            with torch.no_grad():
                for name, p in ctx.model.named_parameters():
                    rows = planted_rows(name)
                    if rows:
                        p[:rows].fill_(1.0)


def planted_rows(name: str) -> int:
    return 2 if name.endswith("k_proj.weight") else 1 if name.endswith("down_proj.weight") else 0


def at_one(params: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(share of the planted entries still exactly 1.0, share of norm gains exactly 1.0)."""
    planted = [p.detach()[:planted_rows(n)] for n, p in params.items() if planted_rows(n)]
    gains = [p.detach() for n, p in params.items() if n.endswith("norm.weight")]
    return _share_at_one(planted), _share_at_one(gains)


def _share_at_one(ts: list[torch.Tensor]) -> float:
    return sum(int((t == 1.0).sum()) for t in ts) / sum(t.numel() for t in ts)


def val_bpb(model: torch.nn.Module, val: Windows) -> float:
    """Mean next-byte loss in bits over the held-out windows, weights upcast to fp32."""
    m = model.float().eval()
    batch = collate([val[i] for i in range(len(val))])
    with torch.no_grad():
        logits = m(batch["input_ids"]).logits
        nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                batch["target_ids"].flatten())
    return float(nll) / math.log(2)


def run(precision: str, update: str, seed: int, a, train_set, val,
        plant: bool = False) -> dict[str, float]:
    watch = Watch(a.steps // 2)
    extra = [Plant(a.steps // 10)] if plant else []
    td = TrainData(dataset=train_set, kind="pretrain", seq_len=a.seq_len, collate_fn=collate,
                   vocab_size=256)
    name = f"{precision}-{update}-seed{seed}" + ("-planted" if plant else "")
    with tempfile.TemporaryDirectory() as tmp:
        out = a.keep / name if a.keep else Path(tmp) / "run"
        cfg = TrainConfig(model="tiny", model_overrides=MODEL, out=str(out),
                          batch_size=a.batch, max_lr=a.lr, warmup_steps=20,
                          max_steps=a.steps, ckpt_interval=a.steps // 4 if a.keep else 0,
                          keep_last=4, device="cpu", seed=seed,
                          precision=precision, bf16_update=update, guard_bf16=False,
                          optimizer_state_dtype="bf16" if precision == "bf16-true" else "fp32",
                          peak_tflops=1.0)
        train(cfg, data=td, callbacks=[*extra, watch])
    params = dict(watch.model.named_parameters())
    unmoved = sum(int((params[n].detach() == h).sum()) for n, h in watch.half.items())
    total = sum(p.numel() for p in params.values())
    locked = check_lockin(params.items()).scan.locked
    tokens = a.steps * a.batch * a.seq_len
    planted, gains = at_one(params)
    return {"bpb": val_bpb(watch.model, val), "locked": locked, "unmoved": unmoved / total,
            "tok_s": tokens / (watch.end - watch.start), "planted": planted, "gains": gains}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", type=Path, default=None,
                    help="keep every run (4 checkpoints each) under this directory, for "
                         "`astrai inspect-weights RUN --all-checkpoints`")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    data = torch.frombuffer(bytearray(CORPUS.read_bytes()), dtype=torch.uint8)
    cut = int(len(data) * 0.9)
    train_set, val = Windows(data[:cut], a.seq_len), Windows(data[cut:], a.seq_len)
    print(f"tiny byte-level Llama {MODEL}, {a.steps} steps of {a.batch}x{a.seq_len} bytes, "
          f"lr {a.lr:g} (cosine to 0.1x), {a.seeds} seeds, {a.threads} threads; "
          f"{len(train_set)} train / {len(val)} validation windows")
    results: dict[str, list[dict[str, float]]] = {}
    for seed in range(a.seeds):  # modes alternate within a seed: drifting load hits all
        for precision, update in MODES:
            name = precision if precision != "bf16-true" else f"bf16-true {update}"
            results.setdefault(name, []).append(run(precision, update, seed, a, train_set, val))
    report(results)
    print(f"\nthe dead zone: after step {a.steps // 10}, rows 0-1 of every k_proj and row 0 "
          "of every down_proj pinned to 1.0 (seed 0)")
    print(f"{'mode':24s} {'planted still 1.0':>18s} {'norm gains at 1.0':>18s} {'locked':>7s} "
          f"{'val bpb':>8s}")
    for precision, update in MODES:
        name = precision if precision != "bf16-true" else f"bf16-true {update}"
        r = run(precision, update, 0, a, train_set, val, plant=True)
        print(f"{name:24s} {100 * r['planted']:17.1f}% {100 * r['gains']:17.1f}% "
              f"{r['locked']:7.0f} {r['bpb']:8.4f}")


def report(results: dict[str, list[dict[str, float]]]) -> None:
    """The table. Seeds pair the runs (same init and data order in every mode), so each
    mode's ratio to bf16-mixed is taken per seed: its mean and its standard error over the
    seeds are what the 1% criterion is read against."""
    ref = [r["bpb"] for r in results["bf16-mixed"]]
    ref_mean = statistics.fmean(ref)
    spread = statistics.stdev(ref) if len(ref) > 1 else float("nan")
    ref_bytes = bytes_per_param("bf16-mixed")["total"]
    print(f"bf16-mixed val bpb {ref_mean:.4f}, seed std {spread:.4f} "
          f"({100 * spread / ref_mean:.2f}% of the mean); ratios below are paired by seed")
    print(f"{'mode':24s} {'val bpb':>8s} {'vs mixed':>9s} {'± s.e.':>7s} {'locked':>7s} "
          f"{'unmoved 2nd half':>17s} {'B/param':>8s} {'vs mixed':>9s} {'tok/s':>8s}")
    for name, rs in results.items():
        precision, _, update = name.partition(" ")
        state = 2 if precision == "bf16-true" else 4
        b = bytes_per_param(precision, update or "nearest", state_bytes=state)["total"]
        bpb = statistics.fmean(r["bpb"] for r in rs)
        ratios = [r["bpb"] / m for r, m in zip(rs, ref)]
        se = statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else math.nan
        print(f"{name:24s} {bpb:8.4f} {statistics.fmean(ratios):9.4f} {se:7.4f} "
              f"{statistics.fmean(r['locked'] for r in rs):7.0f} "
              f"{100 * statistics.fmean(r['unmoved'] for r in rs):16.1f}% {b:8.1f} "
              f"{b / ref_bytes:9.3f} {statistics.fmean(r['tok_s'] for r in rs):8.0f}")


if __name__ == "__main__":
    main()
