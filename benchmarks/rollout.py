"""GRPO rollouts: astrai's RolloutRunner vs HF transformers `generate` (the path TRL's
GRPOTrainer takes without vLLM), on CPU fp32, same weights, same threads.

    python benchmarks/rollout.py [--preset tiny] [--prompts 16] [--group 8] [--new 32]

One rollout = `--group` sampled responses (temperature 1) for each of `--prompts` prompts of
different lengths, with the log-prob of every sampled token (what GRPO needs):

* astrai: RolloutRunner -> a fresh Engine per rollout (paged KV, continuous batching, radix
  sharing of each prompt between its G samples), per-token log-probs from the sampler;
* HF: `generate(num_return_sequences=G, do_sample=True, output_scores=True)` on the
  left-padded prompt batch (static batching, KV cache on), log-probs from
  `compute_transition_scores`.

EOS is ignored on both sides so both produce exactly prompts x group x new tokens. Each
side runs --repeat times, interleaved; the best wall time counts and the CPU-time ratio is
printed too (wall time swings with other load on a shared machine).
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import torch
from peers import hf_twin  # benchmarks/peers.py

from astrai.model import build_model, get_preset
from astrai.train.rollout import RolloutOptions, RolloutRunner


def cpu_time() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_astrai(runner: RolloutRunner, prompts: list[list[int]], key: int) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), cpu_time()
    ro = runner.generate(prompts, key=key, score=False)
    assert all(len(c) == runner.config.max_tokens for c in ro.completion_ids)
    assert all(len(lp) == runner.config.max_tokens for lp in ro.logprobs)
    return time.perf_counter() - t0, cpu_time() - c0


@torch.no_grad()
def run_hf(hf, prompts: list[list[int]], group: int, new: int) -> tuple[float, float]:
    P = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), P, dtype=torch.long)
    mask = torch.zeros(len(prompts), P, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.tensor(p)
        mask[i, P - len(p):] = 1
    t0, c0 = time.perf_counter(), cpu_time()
    out = hf.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0,
                      top_k=0, top_p=1.0, num_return_sequences=group, max_new_tokens=new,
                      min_new_tokens=new, output_scores=True, return_dict_in_generate=True)
    lp = hf.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    assert lp.shape == (len(prompts) * group, new)
    return time.perf_counter() - t0, cpu_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = get_preset(args.preset, vocab_size=2048, max_seq_len=512)
    model = build_model(cfg, seed=0).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, cfg.vocab_size, (int(n),), generator=g).tolist()
               for n in torch.randint(16, 96, (args.prompts,), generator=g)]
    runner = RolloutRunner(model, config=RolloutOptions(max_tokens=args.new),
                           group_size=args.group, seed=0)
    # the engine stops only at the token limit: no tokenizer means no EOS
    tokens = args.prompts * args.group * args.new
    with tempfile.TemporaryDirectory() as tmp:
        hf = hf_twin(model, Path(tmp))
        run_astrai(runner, prompts[:2], key=-1)  # warm up both
        run_hf(hf, prompts[:2], 2, 4)
        ours, theirs = [], []
        for r in range(args.repeat):
            ours.append(run_astrai(runner, prompts, key=r))
            theirs.append(run_hf(hf, prompts, args.group, args.new))
    wall_o, wall_t = min(w for w, _ in ours), min(w for w, _ in theirs)
    cpu_o, cpu_t = min(c for _, c in ours), min(c for _, c in theirs)
    print(f"preset {args.preset}: {args.prompts} prompts x {args.group} samples x {args.new} "
          f"new tokens, threads {torch.get_num_threads()}")
    print(f"astrai RolloutRunner : {tokens / wall_o:9.1f} tokens/s  (wall {wall_o:.2f} s, "
          f"cpu {cpu_o:.2f} s)")
    print(f"HF generate (TRL)    : {tokens / wall_t:9.1f} tokens/s  (wall {wall_t:.2f} s, "
          f"cpu {cpu_t:.2f} s)")
    print(f"ratio astrai / HF    : {wall_t / wall_o:.2f}x wall, {cpu_t / cpu_o:.2f}x cpu")


if __name__ == "__main__":
    main()
