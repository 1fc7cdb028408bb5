"""lm-evaluation-harness tasks: astrai's `astrai` model vs lm-eval's `hf` model (HFLM) on the
exported HF twin of the same checkpoint, same tasks, same requests, CPU fp32.

    python benchmarks/eval.py [--preset small] [--questions 32] [--fewshot 3] [--gen 8]

Two local tasks written to a temporary folder (lines of the bundled public-domain corpus; no
hub): a 4-way multiple-choice task (`--fewshot` examples before each question, so every
question's four requests share a long context) and a generate_until task (greedy, stop at a
newline or a period, at most 16 tokens). Both sides run lm-eval's `simple_evaluate`; the
metrics must agree (the tests hold them equal); the wall-time ratio is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
from rollout import cpu_time  # benchmarks/rollout.py

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from astrai.data.testing import tiny_corpus_path, tiny_tokenizer
from astrai.model import build_model, get_preset
from astrai.model.checkpoint import save_checkpoint
from astrai.model.hf_export import export_hf


def write_tasks(root: Path, questions: int, gen: int, seed: int = 0) -> None:
    lines = [x.strip() for x in tiny_corpus_path().read_text().splitlines()
             if len(x.split()) >= 8]
    rng = random.Random(seed)
    rng.shuffle(lines)
    mc, gens = [], []
    for i in range(questions):
        words = lines[i].split()
        cut = len(words) // 2
        others = [" " + " ".join(lines[(i + k) % len(lines)].split()[cut:]) for k in (1, 2, 3)]
        choices = [" " + " ".join(words[cut:])] + others
        order = list(range(4))
        rng.shuffle(order)
        mc.append({"question": " ".join(words[:cut]), "choices": [choices[o] for o in order],
                   "answer": order.index(0)})
    for i in range(gen):
        words = lines[questions + i].split()
        gens.append({"prompt": " ".join(words[:5]), "target": " " + " ".join(words[5:8])})
    (root / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mc))
    (root / "gen.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gens))
    (root / "bench_mc.yaml").write_text(
        f"task: bench_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {root / 'mc.jsonl'}\ntest_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n')
    (root / "bench_gen.yaml").write_text(
        f"task: bench_gen\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {root / 'gen.jsonl'}\ntest_split: test\noutput_type: generate_until\n"
        'doc_to_text: "{{prompt}}"\ndoc_to_target: "{{target}}"\ngeneration_kwargs:\n'
        '  until: ["\\n", "."]\n  max_gen_toks: 16\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\n")


class Timed:
    """Wall time spent inside the model's request methods (what differs between the two
    sides; lm-eval's task building and metric code is the same for both)."""

    def __init__(self, lm) -> None:
        self.lm, self.seconds, self.cpu = lm, 0.0, 0.0
        self.by_kind: dict[str, float] = {}
        for name in ("loglikelihood", "loglikelihood_rolling", "generate_until"):
            fn = getattr(lm, name)
            setattr(lm, name, self._wrap(getattr(fn, "__wrapped__", fn), name))

    def _wrap(self, fn, name):
        def timed(*a, **kw):
            t0, c0 = time.perf_counter(), cpu_time()
            try:
                return fn(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - t0
                self.cpu += cpu_time() - c0
                self.by_kind[name] = self.by_kind.get(name, 0.0) + cpu_time() - c0
        timed.__wrapped__ = fn
        return timed


def run(lm, manager, fewshot: int) -> tuple[float, float, float, dict]:
    """(wall seconds of simple_evaluate, wall and CPU seconds in the model, metrics)."""
    import lm_eval

    timed = Timed(lm)
    t0 = time.perf_counter()
    res = lm_eval.simple_evaluate(
        model=lm, tasks=["bench_mc", "bench_gen"], num_fewshot=fewshot, task_manager=manager,
        random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
    wall = time.perf_counter() - t0
    print(f"  {type(lm).__name__}: cpu s by request type "
          + ", ".join(f"{k} {v:.2f}" for k, v in timed.by_kind.items()))
    return wall, timed.seconds, timed.cpu, {t: {k: v for k, v in m.items()
                                     if "stderr" not in k and k != "alias"}
                                 for t, m in res["results"].items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--fewshot", type=int, default=3)
    ap.add_argument("--gen", type=int, default=8)
    ap.add_argument("--hf-batch", type=int, default=16, help="HFLM batch_size")
    ap.add_argument("--batch-tokens", type=int, default=1024, help="astrai Scorer tokens")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import logging

    import astrai.eval.harness  # noqa: F401  (registers "astrai")

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        tok = tiny_tokenizer(tmp, vocab_size=512)
        cfg = get_preset(args.preset, vocab_size=512, max_seq_len=512)
        model = build_model(cfg, seed=0)
        ckpt = save_checkpoint(tmp / "ckpt", model, cfg, tokenizer_dir=tok.path)
        export_hf(ckpt, tmp / "hf")
        (tmp / "tasks").mkdir()
        write_tasks(tmp / "tasks", args.questions, args.gen)
        print(f"preset {args.preset} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
              f"params), {args.questions} questions x 4 choices ({args.fewshot}-shot) + "
              f"{args.gen} generations, {torch.get_num_threads()} threads")
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager

        from astrai.eval.harness import AstraiLM

        manager = TaskManager(include_path=str(tmp / "tasks"))  # indexed once, shared
        ours = AstraiLM(str(ckpt), device="cpu", batch_tokens=args.batch_tokens)
        hf = HFLM(pretrained=str(tmp / "hf"), device="cpu", dtype="float32",
                  batch_size=args.hf_batch)
        # interleaved, astrai then HF, --repeat times; the best time of each counts (CPU
        # time too: wall time swings with other load on a shared machine)
        best = {"a": [float("inf")] * 3, "h": [float("inf")] * 3}
        for _ in range(args.repeat):
            *ta, ra = run(ours, manager, args.fewshot)
            *th, rh = run(hf, manager, args.fewshot)
            best["a"] = [min(x, y) for x, y in zip(best["a"], ta)]
            best["h"] = [min(x, y) for x, y in zip(best["h"], th)]
        (wa, ma, ca), (wh, mh, ch) = best["a"], best["h"]
        same = "equal" if ra == rh else f"DIFFER: astrai {ra} vs hf {rh}"
        print(f"astrai (lm-eval model 'astrai') : {wa:7.2f} s wall; in the model {ma:7.2f} s "
              f"wall, {ca:7.2f} s cpu")
        print(f"lm-eval hf (HFLM, batch {args.hf_batch:>3})  : {wh:7.2f} s wall; in the model "
              f"{mh:7.2f} s wall, {ch:7.2f} s cpu")
        print(f"metrics: {same}")
        print(f"ratio hf / astrai (model time) : {mh / ma:.2f}x wall, {ch / ca:.2f}x cpu")
        print(f"ratio hf / astrai (whole run)  : {wh / wa:.2f}x wall")
        if ra != rh:
            sys.exit(1)


if __name__ == "__main__":
    main()
