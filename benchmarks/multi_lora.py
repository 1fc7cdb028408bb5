"""Serving many LoRA adapters from one base in one batch, against the base alone.

The same 64 requests (random prompts and output lengths, all sent at once) through
`astrai serve-bench`'s in-process engine twice per round: on the base alone, and spread
over 4 adapters (request i under adapter i mod 4; ranks 8 and 16, different targets;
astrai-written PEFT directories with non-zero B), every adapter's update gathered per token
in the shared batch (astrai/model/lora_batch.py). Rounds alternate the two, so a busy
machine slows both alike; the figure is the median over rounds of the ratio of output
throughputs (target >= 0.8). Rounds alternate which run goes first.

    python benchmarks/multi_lora.py                    # small preset, 64 requests, 2 rounds
    python benchmarks/multi_lora.py --preset tiny --prompts 16 --rounds 1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from astrai.infer.bench import BenchConfig
from astrai.infer.bench.serve import serve_bench
from astrai.infer.config import CacheConfig
from astrai.model import build_model, get_preset
from astrai.model.adapter import write_adapter
from astrai.model.lora import LoraSpec, apply_lora, lora_layers

ADAPTERS = [(8, ["all-linear"]), (16, ["q_proj", "v_proj"]),
            (8, ["q_proj", "k_proj", "v_proj", "o_proj"]), (16, ["gate_proj", "up_proj",
                                                                 "down_proj"])]


def make_adapters(preset: str, root: Path) -> dict[str, str]:
    out = {}
    for i, (rank, targets) in enumerate(ADAPTERS):
        model = build_model(get_preset(preset), seed=0)
        spec = LoraSpec.build(rank, targets=targets)
        apply_lora(model, spec, seed=i)
        g = torch.Generator().manual_seed(100 + i)
        with torch.no_grad():
            for _, layer in lora_layers(model):
                w = layer.lora_B.weight
                w.copy_(0.01 * torch.randn(w.shape, generator=g))
        out[f"lora{i}"] = str(write_adapter(root / f"lora{i}", model, spec, preset))
    return out


def run(args: argparse.Namespace, loras: dict[str, str]) -> float:
    config = BenchConfig(
        target=args.preset, num_prompts=args.prompts, input_len=(32, 256),
        output_len=(16, 128), seed=0, warmup=2, device="cpu", threads=args.threads,
        loras=loras, max_loras=max(1, len(loras)),
        cache=CacheConfig(max_kv_tokens=32768, max_requests=args.prompts))
    report = serve_bench(config).to_dict()
    m = report["runs"][0]
    return float(m["output_throughput"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        loras = make_adapters(args.preset, Path(tmp))
        ratios, base, multi = [], [], []
        for r in range(args.rounds):
            if r % 2:  # alternate which goes first: a load change hits both alike
                m, b = run(args, loras), run(args, {})
            else:
                b, m = run(args, {}), run(args, loras)
            base.append(b)
            multi.append(m)
            ratios.append(m / b)
            print(f"round {r}: base {b:.1f} tok/s | {len(loras)} adapters {m:.1f} tok/s | "
                  f"ratio {m / b:.3f}", flush=True)
    print(f"{args.preset}: multi-lora {args.prompts} requests: base "
          f"{statistics.median(base):.1f} tok/s | {len(loras)} adapters "
          f"{statistics.median(multi):.1f} tok/s | ratio adapters/base = "
          f"{statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
