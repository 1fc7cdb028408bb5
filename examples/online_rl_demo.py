"""Online RL on a verifiable task, end to end on CPU in minutes.

    python examples/online_rl_demo.py --out runs/online-demo

1. A tiny byte-level BPE tokenizer (bundled corpus) and synthetic records of a verifiable
   task: "Repeat the number: 583" -> "583" (held-out numbers never appear in training).
2. A tiny model learns to copy (sft on clean answers), then picks up a systematic mistake
   (sft on noisy answers that mostly end in 0: 583 -> 580), so its held-out greedy exact
   match drops to <= 0.4 although sampling still finds the right answer now and then.
3. From that checkpoint, online-grpo and online-dpo train with the rule reward `exact`
   (rollouts through the inference engine); held-out greedy accuracy is validated every
   few steps.

Prints the reward and accuracy curves of both runs and a JSON summary (also written to
OUT/summary.json). Every run is seeded, so on one machine the numbers repeat exactly.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

TINY = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16,
        "ffn_dim": 128, "max_seq_len": 64}


def write_records(root: Path, n_train: int, n_val: int, sft_correct: float = 0.25,
                  seed: int = 0) -> dict[str, Path]:
    """Records for disjoint train / held-out numbers: clean sft chats (the number repeated),
    noisy sft chats, and grpo prompts with their reference answers.

    The noisy chats are wrong in a systematic way: only a `sft_correct` share repeats the
    number, the rest end in 0 instead of its last digit (583 -> 580). A model that learned to
    copy and then saw them keeps both habits and prefers the wrong one: greedy decoding is
    mostly wrong while sampling is right often enough for a verifiable reward to tell the
    two apart. (Numbers ending in 0 are left out: both habits agree on them.)
    """
    rng = random.Random(seed)
    numbers = rng.sample([x for x in range(100, 1000) if x % 10], n_train + n_val)
    split = {"train": numbers[:n_train], "val": numbers[n_train:]}
    root.mkdir(parents=True, exist_ok=True)

    def chat(q: str, a: str) -> dict:
        return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}

    paths = {}
    for name, nums in split.items():
        files = {k: root / f"{k}_{name}.jsonl" for k in ("clean", "noisy", "grpo")}
        with (open(files["clean"], "w") as fc, open(files["noisy"], "w") as fn,
              open(files["grpo"], "w") as fg):
            for x in nums:
                q, a = f"Repeat the number: {x}", str(x)
                fc.write(json.dumps(chat(q, a)) + "\n")
                said = a if rng.random() < sft_correct else a[:-1] + "0"
                fn.write(json.dumps(chat(q, said)) + "\n")
                fg.write(json.dumps({"prompt": q, "reference": a}) + "\n")
        paths.update({f"{k}_{name}": f for k, f in files.items()})
    return paths


def build_data(out: Path, n_train: int, n_val: int) -> dict[str, Path]:
    """Preprocessed datasets (astrai preprocess) of the three record sets."""
    from astrai.config.preprocess import load_spec
    from astrai.data.builder import build_dataset
    from astrai.data.testing import tiny_tokenizer

    tok = tiny_tokenizer(out)
    raw = write_records(out / "raw", n_train, n_val)
    dirs = {}
    for name, kind in (("clean", "sft"), ("noisy", "sft"), ("grpo", "grpo")):
        spec = {"kind": kind, "inputs": [str(raw[f"{name}_train"])],
                "val_inputs": [str(raw[f"{name}_val"])], "tokenizer": str(tok.path),
                "output": str(out / f"data-{name}"), "max_seq_len": 48, "overwrite": True}
        if kind == "sft":
            spec.update(sections=[{"field": "messages", "action": "$role", "template": True}],
                        roles={"system": "mask", "user": "mask", "assistant": "train"},
                        packing={"mode": "none"})
        build_dataset(load_spec(data=spec))
        dirs[name] = out / f"data-{name}"
    return dirs


def heldout_accuracy(ckpt: Path, data_dir: Path, max_tokens: int = 6) -> float:
    """Greedy exact match of a checkpoint on the held-out prompts."""
    from astrai.data.dataset import open_dataset
    from astrai.data.tokenizer import Tokenizer
    from astrai.model.checkpoint import load_checkpoint
    from astrai.train.rewards import exact_match
    from astrai.train.rollout import RolloutOptions, RolloutRunner

    val = open_dataset(data_dir, "val")
    prompts = [val[i]["prompts"].tolist() for i in range(len(val))]
    refs = [val[i]["reference"] for i in range(len(val))]
    model, _, _ = load_checkpoint(ckpt)
    runner = RolloutRunner(model, Tokenizer.load(ckpt), exact_match,
                           RolloutOptions(max_tokens=max_tokens))
    ro = runner.generate(prompts, references=refs, greedy=True)
    return float(ro.rewards.mean())


def train_run(out: Path, **kw: Any) -> list[dict]:
    from astrai.config.train import TrainConfig
    from astrai.train import train

    base = {"model_overrides": {}, "device": "cpu", "precision": "fp32", "peak_tflops": 1.0,
            "ckpt_interval": 0, "warmup_steps": 0, "weight_decay": 0.0, "out": str(out)}
    train(TrainConfig(**{**base, **kw}))
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def run_demo(out: str | Path, *, n_train: int = 600, n_val: int = 64, copy_steps: int = 450,
             copy_lr: float = 3e-3, noisy_steps: int = 120, rl_steps: int = 20, eval_interval: int = 5,
             group_size: int = 8, batch_size: int = 16, rl_lr: float = 1e-3, seed: int = 0,
             strategies: tuple[str, ...] = ("online-grpo", "online-dpo")) -> dict[str, Any]:
    """sft on clean copies, then on noisy ones (the start), then each online strategy from
    that start. Returns held-out accuracy and rollout reward curves."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    data = build_data(out, n_train, n_val)
    sft = {"strategy": "sft", "batch_size": 32, "schedule": "wsd", "wsd_decay_ratio": 0.05,
           "epochs": 1000, "seed": seed}
    train_run(out / "sft-clean", data=str(data["clean"]), model="tiny", model_overrides=TINY,
              max_steps=copy_steps, max_lr=copy_lr, **sft)
    copied = out / "sft-clean" / "checkpoints" / f"step_{copy_steps}"
    train_run(out / "sft-noisy", data=str(data["noisy"]), model=str(copied),
              max_steps=noisy_steps, max_lr=5e-3, **sft)
    start = out / "sft-noisy" / "checkpoints" / f"step_{noisy_steps}"
    summary: dict[str, Any] = {
        "copy_accuracy": heldout_accuracy(copied, data["grpo"]),
        "start_accuracy": heldout_accuracy(start, data["grpo"]),
    }
    for strategy in strategies:
        recs = train_run(
            out / strategy, strategy=strategy, data=str(data["grpo"]), model=str(start),
            batch_size=batch_size, max_steps=rl_steps, max_lr=rl_lr, schedule="wsd",
            group_size=group_size, rollout_max_tokens=6, rollout_temperature=1.0,
            reward=["exact"], eval_interval=eval_interval, kl_coef=0.0, beta=0.1, seed=seed)
        key = "reward" if strategy == "online-grpo" else "dpo_reward_mean"
        acc = [(0, summary["start_accuracy"])] + [
            (r["step"], r["val_accuracy"]) for r in recs if "val_accuracy" in r]
        summary[strategy] = {
            "reward": [(r["step"], round(r[key], 4)) for r in recs if key in r],
            "accuracy": acc, "gain": round(acc[-1][1] - acc[0][1], 4),
        }
    summary["seconds"] = round(time.perf_counter() - t0, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/online-demo")
    ap.add_argument("--copy-steps", type=int, default=450)
    ap.add_argument("--noisy-steps", type=int, default=120)
    ap.add_argument("--rl-steps", type=int, default=20)
    args = ap.parse_args()
    s = run_demo(args.out, copy_steps=args.copy_steps, noisy_steps=args.noisy_steps,
                 rl_steps=args.rl_steps)
    print(f"held-out exact match: {s['copy_accuracy']:.3f} after clean sft, "
          f"{s['start_accuracy']:.3f} after noisy sft (the start)")
    for name in ("online-grpo", "online-dpo"):
        r = s[name]
        print(f"\n{name}: held-out accuracy {r['accuracy'][0][1]:.3f} -> "
              f"{r['accuracy'][-1][1]:.3f} (gain {r['gain']:+.3f})")
        print("  accuracy by step: " + ", ".join(f"{st}:{a:.3f}" for st, a in r["accuracy"]))
        print("  rollout reward by step: " + ", ".join(f"{st}:{v:.3f}" for st, v in r["reward"]))
    print(json.dumps(s))


if __name__ == "__main__":
    main()
