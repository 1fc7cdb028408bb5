"""Quality regression: the tiny preset on Shakespeare (4k BPE) — validation bits per byte.

Trains a 4,096-token byte-level BPE on the training text, preprocesses it (rows of 512
tokens, bfd_split packing, the val file as the held-out split), then trains the `tiny` preset
for 250 optimizer steps of 2,048 tokens (batch 4 x 512) with AdamW (lr 3e-3, 20 warmup
steps, cosine to 3e-4, weight decay 0.1, clip 1.0, seed 3407), validating every 25 steps on
the whole val split. Prints the curve and the final val_bpb, and compares it with the
recorded curve in tests/train/assets/ when the corpus is the same (sha256 of the inputs).

    python benchmarks/train_quality.py                      # examples/data (in the project)
    python benchmarks/train_quality.py --train X.jsonl --val Y.jsonl --out /tmp/q --record

Target: val_bpb <= 2.6 within 250 steps (HF transformers' Llama of the same shape
reaches 2.48 in 225 such steps on the 4.7 MB sample corpus).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO / "tests" / "train" / "assets"
STEPS, EVAL_EVERY = 250, 25


def sha(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def astrai(*args: object) -> None:
    cmd = [sys.executable, "-m", "astrai_cli.main", *map(str, args)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=Path, default=REPO / "examples/data/shakespeare_train.jsonl")
    ap.add_argument("--val", type=Path, default=REPO / "examples/data/shakespeare_val.jsonl")
    ap.add_argument("--out", type=Path, default=Path("runs/quality"))
    ap.add_argument("--record", action="store_true", help="write the curve into the assets")
    args = ap.parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    corpus = sha([args.train, args.val])
    if not (out / "tok" / "tokenizer.json").is_file():
        astrai("tokenizer", "train", args.train, "--vocab-size", 4096, "--out", out / "tok")
    if not (out / "data" / "manifest.json").is_file():
        spec = {"kind": "pretrain", "inputs": [str(args.train)], "val_inputs": [str(args.val)],
                "tokenizer": str(out / "tok"), "output": str(out / "data"), "max_seq_len": 512,
                "packing": {"mode": "bfd_split"}, "format": "h5"}
        (out / "spec.json").write_text(json.dumps(spec))
        astrai("preprocess", out / "spec.json")
    run = out / "run"
    if not (run / "checkpoints" / f"step_{STEPS}").is_dir():
        astrai("train", "--strategy", "seq", "--data", out / "data", "--model", "tiny",
               "--out", run, "--batch-size", 4, "--max-steps", STEPS, "--max-lr", 3e-3,
               "--warmup-steps", 20, "--eval-interval", EVAL_EVERY, "--ckpt-interval", STEPS,
               "--seed", 3407, "--device", "cpu")
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    curve = [{k: r[k] for k in ("step", "loss", "lr", "val_loss", "val_bpb") if k in r}
             for r in recs]
    for r in curve:
        if "val_bpb" in r:
            print(f"step {r['step']:4d}  train loss {r['loss']:.4f}  val loss "
                  f"{r['val_loss']:.4f}  val bpb {r['val_bpb']:.4f}")
    final = curve[-1]["val_bpb"]
    print(f"final val_bpb {final:.4f} after {curve[-1]['step']} steps (target <= 2.6)")
    asset = ASSETS / f"tiny_shakespeare_{corpus}.json"
    if args.record:
        ASSETS.mkdir(parents=True, exist_ok=True)
        head = json.dumps({"corpus_sha256_16": corpus, "train": args.train.name,
                           "val": args.val.name})[:-1]
        rows = ",\n  ".join(json.dumps(r) for r in curve)  # one step per line: diffable
        asset.write_text(f'{head}, "curve": [\n  {rows}\n]}}\n')
        print(f"recorded {asset}")
    elif asset.is_file():
        ref = {r["step"]: r for r in json.loads(asset.read_text())["curve"]}
        gaps = [abs(r["val_bpb"] - ref[r["step"]]["val_bpb"]) for r in curve
                if "val_bpb" in r and "val_bpb" in ref.get(r["step"], {})]
        print(f"vs recorded curve {asset.name}: max |delta val_bpb| = {max(gaps):.4f}")
    else:
        print("no recorded curve for this corpus (pass --record to keep one)")


if __name__ == "__main__":
    main()
