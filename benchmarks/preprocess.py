"""Preprocess throughput and memory against the raw HF `tokenizers` batch encoder.

    python benchmarks/preprocess.py [--repeat 10] [--vocab-size 8192] [--workers N]

1. Throughput: `astrai preprocess` (pretrain, bfd_split, h5) on `repeat`x the sample corpus,
   tokens/s with start-up excluded (tokenizer load, worker start), against
   `tokenizers.Tokenizer.encode_batch` of the same texts with the same tokenizer, measured
   in the same run on texts already in memory. Target: ratio >= 0.7.
   The same for an SFT spec: each corpus record becomes a user message and an assistant
   reply (its two halves); the baseline encodes the chat template's renders, made before the
   clock starts, while astrai renders, encodes and masks them (`astrai.data.chat_ids`).
2. Memory: peak RSS of a fresh process preprocessing `repeat`x the corpus against one
   preprocessing 1x, for JSONL and for Parquet input. Target: ratio <= 1.3 (streaming,
   bounded buffers, Parquet read one record batch at a time).
3. All cores: `--workers` all cores against `--workers 1` with the tokenizer held to one
   thread (RAYON_NUM_THREADS=1), fresh processes, start-up excluded. Target: >= 1.6x on two
   cores; and all cores still >= 0.7x raw `encode_batch` on all cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "examples" / "data" / "shakespeare_train.jsonl"

# Peak RSS from VmHWM: ru_maxrss survives fork+exec, so it would report the parent's peak.
CHILD = """
import json, sys
from astrai.config.preprocess import load_spec
from astrai.data.builder import build_dataset
spec = load_spec(data=json.loads(sys.argv[1]))
res = build_dataset(spec, workers=int(sys.argv[2]))
def hwm(pid="self"):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
print(json.dumps({"rss_mb": hwm(), "tokens": res.tokens, "elapsed_s": res.elapsed_s}))
"""


def make_corpus(path: Path, repeat: int) -> None:
    path.write_text(CORPUS.read_text(encoding="utf-8") * repeat, encoding="utf-8")


def spec(inputs: Path, tok: Path, out: Path) -> dict:
    return {"kind": "pretrain", "inputs": [str(inputs)], "tokenizer": str(tok),
            "output": str(out), "max_seq_len": 2048, "packing": {"mode": "bfd_split"},
            "format": "h5", "overwrite": True}


def make_chat_corpus(path: Path, texts: list[str]) -> list[list[dict]]:
    convs = [[{"role": "user", "content": t[: len(t) // 2]},
              {"role": "assistant", "content": t[len(t) // 2:]}] for t in texts]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"messages": c}) + "\n" for c in convs)
    return convs


def child(spec_dict: dict, workers: int, **env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec_dict), str(workers)],
                         check=True, capture_output=True, text=True, env={**os.environ, **env})
    return json.loads(out.stdout.strip().splitlines()[-1])


def to_parquet(jsonl: Path, out: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), out, row_group_size=256)  # ~1.3 MB groups
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--workers", type=int, default=None, help="default: all cores")
    ap.add_argument("--runs", type=int, default=3, help="best of N for each timing")
    args = ap.parse_args()

    from astrai.config.preprocess import load_spec
    from astrai.data.bpe import train_tokenizer
    from astrai.data.builder import build_dataset
    from astrai.data.workers import default_workers

    args.workers = args.workers or default_workers()

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        big, small = tmp / f"corpus_x{args.repeat}.jsonl", tmp / "corpus_x1.jsonl"
        make_corpus(big, args.repeat)
        make_corpus(small, 1)
        tok = train_tokenizer([CORPUS], args.vocab_size, tmp / "tok")
        texts = [json.loads(line)["text"] for line in big.read_text().splitlines()]
        mb = big.stat().st_size / 2**20

        # 1. throughput, best of N each, in this process
        raw_best = fast_best = float("inf")
        n_raw = 0
        for _ in range(args.runs):
            t = time.perf_counter()
            n_raw = sum(len(e.ids) for e in tok.backend.encode_batch(texts))
            raw_best = min(raw_best, time.perf_counter() - t)
            t = time.perf_counter()
            tok.backend.encode_batch_fast(texts)
            fast_best = min(fast_best, time.perf_counter() - t)
        ours_best = float("inf")
        for _ in range(args.runs):
            res = build_dataset(load_spec(data=spec(big, tok.path, tmp / "ds")),
                                workers=args.workers)
            ours_best = min(ours_best, res.elapsed_s)
        stored = res.tokens  # text tokens + BOS/EOS per document
        raw_tps, fast_tps = n_raw / raw_best, n_raw / fast_best
        ours_tps = n_raw / ours_best  # same token count as the baseline: text tokens only

        # 1b. the same for SFT records (chat template, loss masks)
        convs = make_chat_corpus(tmp / "chat.jsonl", texts)
        renders = [tok.render_chat(c) for c in convs]
        sft_raw = float("inf")
        for _ in range(args.runs):
            t = time.perf_counter()
            n_sft = sum(len(e.ids) for e in tok.backend.encode_batch(renders))
            sft_raw = min(sft_raw, time.perf_counter() - t)
        sft_best = float("inf")
        for _ in range(args.runs):
            sft_spec = {**spec(tmp / "chat.jsonl", tok.path, tmp / "ds-sft"), "kind": "sft",
                        "max_seq_len": 16384, "packing": {"mode": "bfd"}}
            sft_best = min(sft_best, build_dataset(load_spec(data=sft_spec),
                                                   workers=args.workers).elapsed_s)

        # 2. memory, fresh processes, JSONL and Parquet
        rss1 = child(spec(small, tok.path, tmp / "m1"), args.workers)["rss_mb"]
        rss10 = child(spec(big, tok.path, tmp / "m10"), args.workers)["rss_mb"]
        pq_small = to_parquet(small, tmp / "x1.parquet")
        pq_big = to_parquet(big, tmp / f"x{args.repeat}.parquet")
        prss1 = child(spec(pq_small, tok.path, tmp / "p1"), args.workers)["rss_mb"]
        prss10 = child(spec(pq_big, tok.path, tmp / "p10"), args.workers)["rss_mb"]

        # 3. all cores against one core (tokenizer held to one thread), fresh processes
        one = min(child(spec(big, tok.path, tmp / "w1"), 1, RAYON_NUM_THREADS="1")
                  ["elapsed_s"] for _ in range(args.runs))
        alln = min(child(spec(big, tok.path, tmp / "wn"), args.workers)["elapsed_s"]
                   for _ in range(args.runs))
        pq_all = min(child(spec(pq_big, tok.path, tmp / "pn"), args.workers)["elapsed_s"]
                     for _ in range(args.runs))

    print(f"corpus: {args.repeat}x sample = {mb:.1f} MB, {len(texts)} records, "
          f"{n_raw:,} text tokens ({stored:,} stored with BOS/EOS), vocab {args.vocab_size}, "
          f"workers {args.workers}")
    print(f"tokenizers encode_batch        : {raw_tps:12,.0f} tokens/s")
    print(f"tokenizers encode_batch_fast   : {fast_tps:12,.0f} tokens/s")
    print(f"astrai preprocess (start-up excluded, read+parse+tokenize+pack+write): "
          f"{ours_tps:12,.0f} tokens/s")
    print(f"throughput ratio vs encode_batch     : {ours_tps / raw_tps:.2f}  (target >= 0.70)")
    print(f"throughput ratio vs encode_batch_fast: {ours_tps / fast_tps:.2f}")
    print(f"sft: tokenizers encode_batch of the renders: {n_sft / sft_raw:12,.0f} tokens/s; "
          f"astrai preprocess sft: {n_sft / sft_best:12,.0f} tokens/s")
    print(f"sft throughput ratio vs encode_batch : {sft_raw / sft_best:.2f}  (target >= 0.70)")
    print(f"peak RSS 1x: {rss1:.0f} MB, {args.repeat}x: {rss10:.0f} MB, "
          f"ratio {rss10 / rss1:.2f}  (target <= 1.30)")
    print(f"peak RSS parquet 1x: {prss1:.0f} MB, {args.repeat}x: {prss10:.0f} MB, "
          f"ratio {prss10 / prss1:.2f}  (target <= 1.30)")
    print(f"--workers 1, tokenizer on one thread : {n_raw / one:12,.0f} tokens/s")
    print(f"--workers {args.workers} (all cores)             : {n_raw / alln:12,.0f} tokens/s "
          f"(parquet input: {n_raw / pq_all:,.0f})")
    print(f"all cores vs one core                : {one / alln:.2f}x  (target >= 1.60 on 2 cores)")
    print(f"all cores vs encode_batch (all cores): {raw_best / alln:.2f}  (target >= 0.70)")


if __name__ == "__main__":
    main()
