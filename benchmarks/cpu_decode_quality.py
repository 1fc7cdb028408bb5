"""The quality columns of cpu_decode.py, on a TRAINED model (random weights make bits per byte
meaningless): `astrai quickstart --steps N` (the tiny Shakespeare model), its GGUF exports
(f32, q8_0, q4_0 from `astrai export --format gguf`), and on the held-out plays
(examples/data/shakespeare/shakespeare_val.jsonl):

  bits per byte   astrai: `astrai.eval.perplexity.evaluate_perplexity` (fp32, int8, int4);
                  llama.cpp: llama-cpp-python (the same vendored llama.cpp as the benchmark's
                  llama-bench) with all logits kept, on the SAME token ids in the SAME rolling
                  windows (astrai.eval.windows), summed into bits per byte the same way
  greedy tokens   astrai's engine against llama-cpp-python (f32 KV cache) from the same
                  prompts: f32 asserted equal; q8_0 / q4_0 against astrai int8 / int4 as the
                  fraction of tokens generated before the first difference

llama-cpp-python runs in a child process per GGUF, so a crash is a BROKEN row, not the end.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
VAL = ROOT / "examples" / "data" / "shakespeare" / "shakespeare_val.jsonl"
MAX_LEN, DOCS, PROMPTS, NEW = 256, 4, 4, 32
PAIRS = (("fp32", None, "f32", {"dtype": torch.float32}),
         ("int8", "int8", "q8_0", {"quantize": "q8_0"}),
         ("int4", "int4", "q4_0", {"quantize": "q4_0"}))


def train(work: Path, steps: int) -> Path:
    """The quickstart's checkpoint after `steps` steps (its CLI, as a user runs it)."""
    out = work / "quickstart"
    r = subprocess.run([sys.executable, "-m", "astrai_cli.main", "quickstart", "--steps",
                        str(steps), "--out", str(out), "--json"], capture_output=True,
                       text=True, cwd=work, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"astrai quickstart failed: {r.stderr.strip()[-300:]}")
    return Path(json.loads((out / "summary.json").read_text())["checkpoint"])


def windows_of(ckpt: Path) -> tuple[list[tuple[list[int], list[int]]], int, list[list[int]]]:
    """(rolling windows over the held-out documents, their UTF-8 bytes, greedy prompts)."""
    from astrai.eval.perplexity import read_documents
    from astrai.eval.windows import rolling_windows
    from astrai.infer.loading import load_tokenizer

    tok = load_tokenizer(ckpt)
    docs = read_documents(VAL, "text", tok, DOCS)
    prefix = tok.bos_id if tok.bos_id is not None else tok.eos_id
    wins = [(list(c), list(t)) for d in docs
            for c, t in rolling_windows(tok.encode(d), prefix, MAX_LEN)]
    ids = tok.encode(docs[0])
    prompts = [ids[i * 200:i * 200 + 24] for i in range(PROMPTS)]
    return wins, sum(len(d.encode("utf-8")) for d in docs), prompts


def astrai_side(ckpt: Path, quantize: str | None, prompts: list[list[int]]) -> dict:
    from astrai.eval.perplexity import evaluate_perplexity
    from astrai.infer import Engine, SamplingParams
    from astrai.infer.loading import load_model

    bpb = evaluate_perplexity(ckpt, VAL, device="cpu", max_len=MAX_LEN, limit=DOCS,
                              quantize=quantize).bpb
    eng = Engine(load_model(ckpt, device="cpu", quantize=quantize), None)
    outs = eng.generate(prompts, SamplingParams.greedy(NEW, ignore_eos=True))
    return {"bpb": bpb, "tokens": [list(o.token_ids) for o in outs]}


def llama_worker(job: str) -> None:
    """Child process: bits per byte and greedy tokens of one GGUF through llama-cpp-python."""
    import llama_cpp
    import numpy as np

    j = json.loads(job)
    llm = llama_cpp.Llama(model_path=j["gguf"], n_ctx=MAX_LEN + NEW + 32, logits_all=True,
                          n_threads=j["threads"], n_threads_batch=j["threads"],
                          type_k=0, type_v=0, verbose=False)
    nll = 0.0
    for ctx, cont in j["windows"]:
        seq = (ctx + cont)[:-1]  # position i's logits predict token i + 1
        llm.reset()
        llm.eval(seq)
        logits = np.asarray(llm.scores[len(ctx) - 1:len(seq)], dtype=np.float64)
        logz = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
        nll -= float((logits[np.arange(len(cont)), cont] - logz).sum())
    tokens = []
    for p in j["prompts"]:
        out = []
        for t in llm.generate(p, temp=0.0, top_k=1, reset=True):
            out.append(int(t))
            if len(out) == NEW:
                break
        tokens.append(out)
    print(json.dumps({"bpb": nll / math.log(2) / j["bytes"], "tokens": tokens}))


def llama_side(gguf: Path, wins, nbytes: int, prompts, threads: int) -> dict:
    job = json.dumps({"gguf": str(gguf), "windows": wins, "bytes": nbytes,
                      "prompts": prompts, "threads": threads})
    r = subprocess.run([sys.executable, __file__, job], capture_output=True, text=True,
                       check=False)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1][:160]
        return {"error": f"llama-cpp-python exited with {r.returncode}: {tail}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Fraction of greedy tokens generated before each prompt's first difference."""
    same = 0
    for x, y in zip(a, b):
        same += next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
    return same / max(1, sum(len(x) for x in a))


def measure(work: Path, steps: int, threads: int, ckpt: Path | None = None) -> dict:
    """{astrai format: {bpb, tokens}, llama.cpp format: {bpb, tokens} or {error}, ...} of
    `ckpt` (None: a quickstart model trained for `steps` steps)."""
    from astrai.model.gguf_export import export_gguf

    ckpt = ckpt or train(work, steps)
    wins, nbytes, prompts = windows_of(ckpt)
    out: dict = {"checkpoint": str(ckpt), "tokens_scored": sum(len(t) for _, t in wins),
                 "bytes": nbytes}
    for ours, quantize, theirs, kw in PAIRS:
        out[ours] = astrai_side(ckpt, quantize, prompts)
        gguf = export_gguf(ckpt, work / f"quality-{theirs}.gguf", overwrite=True, **kw)
        out[theirs] = llama_side(gguf, wins, nbytes, prompts, threads)
        if "tokens" in out[theirs]:
            out[theirs]["agreement"] = agreement(out[ours]["tokens"], out[theirs]["tokens"])
    return out


def lines(q: dict) -> list[str]:
    """The quality table and the token checks (f32 asserted: a FAIL line when unequal)."""
    title = (f"quality: quickstart model {q['checkpoint']} (trained; NOT the speed models), "
             f"{q['tokens_scored']} held-out tokens ({q['bytes']} bytes of {VAL.name}, "
             f"windows of {MAX_LEN}); greedy: {PROMPTS} prompts x {NEW} tokens")
    rows = [title]
    fp32 = q["fp32"]["bpb"]
    for ours, _, theirs, _ in PAIRS:
        a, p = q[ours], q[theirs]
        peer = f"BROKEN ({p.get('error')})"
        if "error" not in p:
            peer = f"{p['bpb']:.4f} bpb, greedy = astrai {ours}: {p['agreement']:.1%}"
        rows.append(f"  astrai {ours:5s} {a['bpb']:.4f} bpb ({a['bpb'] / fp32 - 1:+.1%} vs fp32)"
                    f" | llama.cpp {theirs:5s} {peer}")
    f32 = q["f32"]
    if "tokens" in f32:
        ok = f32["tokens"] == q["fp32"]["tokens"]
        rows.append(f"tokens astrai fp32 == llama.cpp f32 (greedy, exact formats): "
                    f"{'PASS' if ok else 'FAIL'} ({f32['agreement']:.1%} before a difference)")
    ratio = q["int4"]["bpb"] / fp32
    rows.append(f"target int4 bpb within 3% of fp32: {ratio:.4f} "
                f"{'PASS' if ratio <= 1.03 else 'MISS'}")
    return rows


if __name__ == "__main__":
    llama_worker(sys.argv[1])
