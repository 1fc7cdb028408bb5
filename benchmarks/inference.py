"""Inference engine vs HF transformers `generate` on CPU (fp32), same weights, same threads.

    python benchmarks/inference.py [--presets tiny,small] [--threads 1] [--quick]

Workloads:
  (a) one request at a time, greedy, a fixed number of new tokens: output tokens/s of the
      engine and of HF `generate` (sdpa attention, KV cache on), and the engine's time
      against the floor of the weight matmuls alone (one token through every linear layer);
  (b) 64 requests, input 32-256 and output 16-256 tokens: wall-clock output tokens/s of the
      engine (continuous batching, all submitted at once) against HF `generate` in static
      batches of 16 (left-padded, each batch run to its longest output; only the tokens
      each request asked for count);
  (c) shared prefix: 8 groups of 8 prompts sharing a 384-token system prompt: TTFT p50 with
      the radix cache against without it (all requests arrive at once);
  (s) speculative decoding (not with --presets: its own models): one request on the
      `astrai quickstart` model continuing a passage its prompt quotes (100 tokens of
      held-out text, "\n\n", the passage's first 24 tokens; 120 new tokens, greedy), plain
      decoding against prompt lookup (ngram, k=4 and 8) and against a draft model (k=4):
      tokens/s, their ratio, the acceptance rate, and how many generated tokens copy the
      passage. The target is the quickstart recipe and the draft the same recipe (same
      tokenizer and data) with a 1-layer model of the fallback's width, each trained
      --spec-steps steps (854, the recipe's epoch; 300 with --quick; training time, steps
      and validation loss printed), or reused with --spec-target / --spec-draft DIR.

Both sides' tokens are compared and the count of identical outputs is printed with every
figure. Each side runs --repeat times, interleaved, and its best time counts; CPU-time
ratios are printed too, since on a shared machine wall time swings with other load. In
(a)-(d) weights are random with init_std=0.1 (no trained checkpoint is assumed to exist
here); that makes greedy choices well separated, so token equality is a fair
check, and it changes no cost. EOS is ignored on both sides so lengths are exact.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from peers import hf_twin  # benchmarks/peers.py

from astrai.infer import CacheConfig, SamplingParams, SchedulerConfig
from astrai.infer.build import EngineOptions, build_engine
from astrai.infer.config import SpeculativeConfig
from astrai.model import build_model, get_preset


def make_engine(model, radix=True, max_running=64, decode="auto", speculative=None,
                draft_model=None):
    cache = CacheConfig(page_size=16, max_kv_tokens=64 * 1024, max_requests=max_running,
                        radix=radix)
    # the builder chat, serve and serve-bench use (huge pages on: the benchmark's own models)
    return build_engine(model, None, EngineOptions(decode=decode, speculative=speculative),
                        cache, scheduler=SchedulerConfig(max_step_tokens=2048),
                        draft_model=draft_model)


def prompts_of(lengths, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


@torch.inference_mode()
def hf_generate(hf, batch, new_tokens):
    """Left-padded static batch -> generated ids per row (new tokens only)."""
    width = max(map(len, batch))
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for i, p in enumerate(batch):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                      min_new_tokens=new_tokens, do_sample=False)
    return out[:, width:].tolist()


@torch.inference_mode()
def matmul_floor(model, n_tokens, reps=3):
    """(wall, CPU) seconds for n_tokens single-token passes through every weight matmul
    (no attention, norms or sampling): the floor for one-request decoding."""
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if model.lm_head is None:
        weights.append(model.embed_tokens.weight)
    x = {w.shape[1]: torch.randn(1, w.shape[1]) for w in weights}
    best, best_cpu = float("inf"), float("inf")
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n_tokens):
            for w in weights:
                F.linear(x[w.shape[1]], w)
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    return best, best_cpu


def timed(fn):
    """(result, wall seconds, process CPU seconds)."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def best_of(repeat, *fns):
    """Run the functions in turn `repeat` times (interleaved, so drifting machine load hits
    both sides alike); per function the result and its best wall and CPU times."""
    res = [[None, float("inf"), float("inf")] for _ in fns]
    for _ in range(repeat):
        for r, fn in zip(res, fns):
            out, wall, cpu = timed(fn)
            r[0], r[1], r[2] = out, min(r[1], wall), min(r[2], cpu)
    return res


def bench_single(model, hf, vocab, n_prompts, new_tokens, repeat):
    prompts = prompts_of([64] * n_prompts, vocab, seed=1)
    eng = make_engine(model)
    params = SamplingParams.greedy(new_tokens, ignore_eos=True)
    eng.generate(prompts[0], SamplingParams.greedy(4, ignore_eos=True))  # warm-up
    hf_generate(hf, [prompts[0]], 4)
    (ours, t_ours, c_ours), (theirs, t_hf, c_hf) = best_of(
        repeat, lambda: [eng.generate(p, params)[0].token_ids for p in prompts],
        lambda: [hf_generate(hf, [p], new_tokens)[0] for p in prompts])
    same = sum(a == b for a, b in zip(ours, theirs))
    floor, floor_cpu = matmul_floor(model, new_tokens * n_prompts)
    n = new_tokens * n_prompts
    return {"same": f"{same}/{n_prompts}", "engine_tok_s": n / t_ours, "hf_tok_s": n / t_hf,
            "vs_hf": t_hf / t_ours, "vs_hf_cpu": c_hf / c_ours, "floor_tok_s": n / floor,
            "vs_floor": floor / t_ours, "vs_floor_cpu": floor_cpu / c_ours}


def bench_batch(model, hf, vocab, n_req, quick, repeat):
    g = torch.Generator().manual_seed(2)
    hi_in, hi_out = (128, 64) if quick else (256, 256)
    in_lens = torch.randint(32, hi_in + 1, (n_req,), generator=g).tolist()
    out_lens = torch.randint(16, hi_out + 1, (n_req,), generator=g).tolist()
    prompts = prompts_of(in_lens, vocab, seed=3)
    params = [SamplingParams.greedy(n, ignore_eos=True) for n in out_lens]
    engines = []

    def ours():
        engines.append(make_engine(model))
        return engines[-1].generate(prompts, params)

    def hf_all():
        res = []
        for s in range(0, n_req, 16):
            rows = hf_generate(hf, prompts[s:s + 16], max(out_lens[s:s + 16]))
            res += [r[:n] for r, n in zip(rows, out_lens[s:s + 16])]
        return res

    (outs, t_ours, c_ours), (theirs, t_hf, c_hf) = best_of(repeat, ours, hf_all)
    same = sum(o.token_ids == t for o, t in zip(outs, theirs))
    n = sum(out_lens)
    st = engines[-1].stats()
    return {"same": f"{same}/{n_req}", "engine_tok_s": n / t_ours, "hf_tok_s": n / t_hf,
            "vs_hf": t_hf / t_ours, "vs_hf_cpu": c_hf / c_ours, "peak_running": st.peak_running,
            "preemptions": st.num_preemptions}


def bench_prefix(model, vocab, groups, per_group, system_len, repeat):
    systems = prompts_of([system_len] * groups, vocab, seed=4)
    tails = prompts_of([32] * (groups * per_group), vocab, seed=5)
    # interleave the groups, as independent users would arrive
    prompts = [systems[i % groups] + tails[i] for i in range(groups * per_group)]
    params = SamplingParams.greedy(16, ignore_eos=True)
    best = {True: (float("inf"),), False: (float("inf"),)}
    for _ in range(repeat):
        for radix in (True, False):
            eng = make_engine(model, radix=radix)
            outs, wall, _ = timed(lambda e=eng: e.generate(prompts, params))
            p50 = statistics.median(o.metrics.ttft for o in outs)
            if p50 < best[radix][0]:
                best[radix] = (p50, wall, eng.stats().prefix_hit_rate, outs)
    same = sum(a.token_ids == b.token_ids for a, b in zip(best[True][3], best[False][3]))
    return {"same": f"{same}/{len(prompts)}", "ttft_p50_radix_s": best[True][0],
            "ttft_p50_plain_s": best[False][0], "ttft_ratio": best[True][0] / best[False][0],
            "hit_rate": best[True][2], "wall_radix_s": best[True][1],
            "wall_plain_s": best[False][1]}


def bench_decode_modes(model, vocab, batch, new_tokens, repeat):
    """(d) Decode tokens/s of `batch` concurrent requests (16-token prompts, EOS ignored)
    under each decode mode the device offers: eager, static and, on CUDA, graphs; the
    tokens must agree (greedy)."""
    modes = ["eager", "static"] + (["graphs"] if next(model.parameters()).is_cuda else [])
    prompts = prompts_of([16] * batch, vocab, 7)
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    out = {}
    for mode in modes:
        eng = make_engine(model, max_running=max(batch, 1), decode=mode)
        eng.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        best, toks = None, None
        for _ in range(repeat):
            sync = torch.cuda.synchronize if next(model.parameters()).is_cuda else (lambda: None)
            sync()
            t0 = time.perf_counter()
            res = eng.generate(prompts, params)
            sync()
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
            toks = [r.token_ids for r in res]
        out[mode] = (batch * new_tokens / best, toks)
    same = all(v[1] == out["eager"][1] for v in out.values())
    return {m: v[0] for m, v in out.items()}, same


DRAFT_OVERRIDES = {"n_layers": 1, "dim": 128, "n_heads": 2, "n_kv_heads": 1, "ffn_dim": 384,
                   "tie_embeddings": True, "qk_norm": True}
"""The draft: the quickstart recipe's model cut to 1 layer of the fallback's width."""
SPEC_PASSAGE_CHARS, SPEC_PASSAGE_TOKENS, SPEC_QUOTED, SPEC_NEW = 2000, 100, 24, 120
"""The prompt: 100 tokens of held-out text from character 2000 of the first validation
record, "\\n\\n", then the passage's first 24 tokens again; 120 new tokens (all within the
quickstart model's 256-token context)."""
SPEC_REPEAT = 10
"""(s) runs per engine at least (interleaved, the best counts): a run is ~40 ms, and this
host's speed swings by 10% from one to the next."""


TRAIN_THREADS = torch.get_num_threads()
"""Training uses torch's default thread count (--threads is the decoding's)."""


def quickstart_model(out, steps, overrides=None):
    """(checkpoint dir, info) of `astrai quickstart` run into `out` with `steps` steps (the
    recipe's model, or `overrides` on the tiny preset instead)."""
    from astrai.quickstart.config import QuickstartConfig
    from astrai.quickstart.pipeline import run_quickstart

    extra = {} if overrides is None else {"model_overrides": overrides,
                                          "fallback_overrides": None}
    r = run_quickstart(QuickstartConfig(out=str(out), steps=steps, threads=TRAIN_THREADS,
                                        **extra))
    return r.checkpoint, (f"trained {r.steps} steps in {r.stage_s.get('train', 0):.0f}s "
                          f"({r.threads} threads), {r.params / 1e6:.2f}M params, val loss "
                          f"{r.val_loss:.2f}")


def spec_prompt(tok):
    """(prompt ids, the passage's continuation after the quoted start) for `tok`."""
    import json

    from astrai.quickstart.corpus import find_corpus

    with open(find_corpus(None).val) as f:
        text = json.loads(f.readline())["text"]
    passage = tok.encode(text[SPEC_PASSAGE_CHARS:SPEC_PASSAGE_CHARS + 2000])
    passage = passage[:SPEC_PASSAGE_TOKENS]
    return passage + tok.encode("\n\n") + passage[:SPEC_QUOTED], passage[SPEC_QUOTED:]


def _bpe(path):
    """The vocabulary and merges of the tokenizer in checkpoint `path` (None if none)."""
    import json

    f = Path(path) / "tokenizer.json"
    return json.loads(f.read_text())["model"] if f.is_file() else None


def spec_models(args, tmp):
    """(target, draft, tokenizer, info): the checkpoints given, or quickstart runs."""
    from astrai.infer.loading import load_model, load_tokenizer

    steps = 300 if args.quick else args.spec_steps
    paths, info = {}, []
    for role, given, overrides in (("target", args.spec_target, None),
                                   ("draft", args.spec_draft, DRAFT_OVERRIDES)):
        if given:
            paths[role] = given
            info.append(f"{role} {given}")
        else:
            paths[role], what = quickstart_model(Path(tmp) / role, steps, overrides)
            info.append(f"{role} quickstart{' ' + str(overrides) if overrides else ''}: {what}")
    tok = load_tokenizer(paths["target"])
    if tok is None or _bpe(paths["target"]) != _bpe(paths["draft"]):
        raise SystemExit("--spec-target / --spec-draft: the two checkpoints must hold the "
                         "same tokenizer (both from `astrai quickstart` on the same corpus)")
    target, draft = (load_model(paths[r], device="cpu") for r in ("target", "draft"))
    return target, draft, tok, "; ".join(info)


def bench_speculative(args):
    """(s) One request, greedy, continuing a passage quoted in its prompt, on the quickstart
    model: plain decoding, prompt lookup (k=4 and 8) and a smaller quickstart model as the
    draft (k=4); tokens must agree."""
    with tempfile.TemporaryDirectory() as tmp:
        target, draft, tok, info = spec_models(args, tmp)
        torch.set_num_threads(args.threads)
        prompt, continuation = spec_prompt(tok)
    params = SamplingParams.greedy(SPEC_NEW, ignore_eos=True)
    engines = {"plain": make_engine(target)}
    for k in (4, 8):
        engines[f"ngram k={k}"] = make_engine(target, speculative=SpeculativeConfig(
            method="ngram", num_speculative_tokens=k))
    engines["draft k=4"] = make_engine(target, speculative=SpeculativeConfig(
        method="draft", num_speculative_tokens=4), draft_model=draft)
    for eng in engines.values():
        eng.generate(prompt, SamplingParams.greedy(8, ignore_eos=True))  # warm-up
    runs = best_of(max(args.repeat, SPEC_REPEAT),
                   *[lambda e=e: e.generate(prompt, params)[0].token_ids
                     for e in engines.values()])
    res = {}
    for (name, eng), (toks, wall, cpu) in zip(engines.items(), runs):
        st = eng.stats()
        res[name] = {"tok_s": len(toks) / wall, "cpu_s": cpu, "tokens": toks,
                     "accept": st.spec_acceptance_rate, "proposed": st.spec_draft_tokens}
    out = res["plain"]["tokens"]
    copied = next((i for i, (a, b) in enumerate(zip(out, continuation)) if a != b),
                  min(len(out), len(continuation)))
    text = {"prompt_tokens": len(prompt), "new_tokens": len(out), "copied": copied,
            "continuation": len(continuation), "output": tok.decode(out)}
    return res, info, text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="smaller workloads (a smoke run)")
    ap.add_argument("--only", default="a,b,c", help="which workloads: a,b,c,d,s (d: decode "
                    "modes eager / static / CUDA graphs at batch 1 and 32; s: speculative "
                    "decoding)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per side; the best counts")
    ap.add_argument("--device", default="cpu", help="(d) only: cpu or cuda")
    ap.add_argument("--dtype", default="float32", help="(d) only: float32 | bfloat16 | float16")
    ap.add_argument("--spec-target", help="(s) only: a quickstart checkpoint as the target "
                    "(default: train one, --spec-steps steps)")
    ap.add_argument("--spec-draft", help="(s) only: a smaller quickstart checkpoint (same "
                    "tokenizer) as the draft (default: train one, --spec-steps steps)")
    ap.add_argument("--spec-steps", type=int, default=854, help="(s) only: training steps of "
                    "each model trained (default 854, the recipe's epoch; 300 with --quick)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    only = set(args.only.split(","))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, fp32, CPU")
    if "s" in only:
        print_speculative(*bench_speculative(args))
        if not only - {"s"}:
            return
    for name in args.presets.split(","):
        model = build_model(get_preset(name, init_std=0.1), seed=0).eval()
        vocab = model.config.vocab_size
        with tempfile.TemporaryDirectory() as tmp:
            hf = hf_twin(model, Path(tmp)) if only & {"a", "b"} else None
        print(f"\n== preset {name} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
              "params)")
        if "a" in only:
            r = bench_single(model, hf, vocab, 2 if args.quick else 4, 32 if args.quick else 128,
                             args.repeat)
            print(f"(a) one request at a time: engine {r['engine_tok_s']:.1f} tok/s, HF "
                  f"{r['hf_tok_s']:.1f} tok/s -> {r['vs_hf']:.2f}x HF (CPU time "
                  f"{r['vs_hf_cpu']:.2f}x); matmul floor "
                  f"{r['floor_tok_s']:.1f} tok/s -> engine at {r['vs_floor']:.2f} of the "
                  f"floor (CPU time {r['vs_floor_cpu']:.2f}); same tokens {r['same']}")
        if "b" in only:
            r = bench_batch(model, hf, vocab, 64, args.quick, args.repeat)
            print(f"(b) 64 mixed requests: engine {r['engine_tok_s']:.1f} tok/s, HF static "
                  f"batches of 16 {r['hf_tok_s']:.1f} tok/s -> {r['vs_hf']:.2f}x HF (CPU time "
                  f"{r['vs_hf_cpu']:.2f}x) "
                  f"(peak running {r['peak_running']}, preemptions {r['preemptions']}); "
                  f"same tokens {r['same']}")
        if "d" in only:
            m = model.to(device=args.device, dtype=getattr(torch, args.dtype))
            for batch in (1, 32):
                r, same = bench_decode_modes(m, vocab, batch, 32 if args.quick else 128,
                                             args.repeat)
                cells = ", ".join(f"{k} {v:.1f} tok/s" for k, v in r.items())
                ratios = ", ".join(f"{k}/eager {v / r['eager']:.2f}x" for k, v in r.items()
                                   if k != "eager")
                print(f"(d) decode modes, batch {batch}, {args.device} {args.dtype}: {cells}"
                      f" -> {ratios}; same tokens {same}")
            model = m.to("cpu", torch.float32)
        if "c" in only:
            r = bench_prefix(model, vocab, 8, 8, 128 if args.quick else 384, args.repeat)
            print(f"(c) shared prefix: TTFT p50 {r['ttft_p50_radix_s'] * 1e3:.0f} ms with radix"
                  f" vs {r['ttft_p50_plain_s'] * 1e3:.0f} ms without -> {r['ttft_ratio']:.2f}x"
                  f" (hit rate {r['hit_rate']:.2f}; wall {r['wall_radix_s']:.1f}s vs "
                  f"{r['wall_plain_s']:.1f}s); same tokens {r['same']}")


def print_speculative(res, info, text):
    plain = res["plain"]
    print(f"\n== speculative decoding ({info})")
    print(f"prompt {text['prompt_tokens']} tokens (a {SPEC_PASSAGE_TOKENS}-token held-out "
          f"passage, then its first {SPEC_QUOTED} again), {text['new_tokens']} new tokens "
          f"greedy; the model copies {text['copied']} of the passage's next "
          f"{text['continuation']} tokens before it departs from the quote")
    print(f"plain output: {text['output']!r}")
    print(f"(s) plain: {plain['tok_s']:.1f} tok/s")
    for name, r in res.items():
        if name == "plain":
            continue
        same = r["tokens"] == plain["tokens"]
        print(f"(s) speculative {name}: {r['tok_s']:.1f} tok/s vs plain {plain['tok_s']:.1f} "
              f"tok/s -> {r['tok_s'] / plain['tok_s']:.2f}x (CPU time "
              f"{plain['cpu_s'] / r['cpu_s']:.2f}x); acceptance {100 * r['accept']:.1f}% of "
              f"{r['proposed']} proposed; same tokens {same}")


if __name__ == "__main__":
    main()
