"""astrai vs llama.cpp on one GGUF export: greedy tokens equal, decode tokens/s of each.

Needs llama-cpp-python, which builds llama.cpp from source (several minutes; a C/C++
compiler and CMake):

    pip install 'astrai[gguf]' llama-cpp-python
    python benchmarks/gguf_export.py                       # a random tiny model + tokenizer
    python benchmarks/gguf_export.py --checkpoint runs/sft --tokens 64
    python benchmarks/gguf_export.py --quantize q8_0       # tokens compared, not required equal

Exports CHECKPOINT with `astrai export --format gguf --dtype float32` (or --quantize), runs
the same prompt greedily in astrai (the plain forward pass, fp32, no cache: a correctness
reference, not astrai's engine speed) and in llama.cpp, and prints both token lists, the
first position where they differ (none expected in f32, with llama.cpp's KV cache in f32
too: both compute the same network and only last-bit rounding differs) and llama.cpp's decode tokens/s. Without
--checkpoint it trains a 512-token byte-level BPE on a generated corpus and builds a
random 4-layer model around it.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from astrai.data.tokenizer import Tokenizer
from astrai.model.gguf_export import export_gguf
from astrai.model.hf import load_pretrained


def tiny_checkpoint(root: Path) -> Path:
    from astrai.data.bpe import train_tokenizer
    from astrai.model import ModelConfig, build_model
    from astrai.model.checkpoint import save_checkpoint

    (root / "c.txt").write_text("\n".join(f"the river {i} runs past the mill and the {i % 7} "
                                          "stones." for i in range(2000)))
    train_tokenizer([root / "c.txt"], 512, root / "tok")
    config = ModelConfig(vocab_size=512, dim=256, n_layers=4, n_heads=8, n_kv_heads=4,
                         ffn_dim=512, max_seq_len=512, init_std=0.1)
    save_checkpoint(root / "ck", build_model(config, seed=0), config,
                    tokenizer_dir=root / "tok", meta={"step": 0})
    return root / "ck"


def astrai_greedy(checkpoint: Path, ids: list[int], n: int) -> list[int]:
    model, _, _ = load_pretrained(checkpoint, dtype=torch.float32)
    seq, out = list(ids), []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(torch.tensor([seq])).logits[0, -1].argmax())
            out.append(nxt)
            seq.append(nxt)
    return out


def llama_cpp_greedy(gguf_file: Path, ids: list[int], n: int, threads: int
                     ) -> tuple[list[int], float]:
    import llama_cpp

    # type_k/type_v 0 = GGML F32: llama.cpp's default f16 KV cache alone moves logits by
    # ~1e-3, enough to flip a near-tie of a random model; in f32 they agree to ~5e-6.
    llm = llama_cpp.Llama(model_path=str(gguf_file), n_ctx=len(ids) + n + 8,
                          n_threads=threads, verbose=False, type_k=0, type_v=0)
    out, start = [], time.perf_counter()
    for t in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        out.append(t)
        if len(out) == n:
            break
    return out, n / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, help="astrai or HF checkpoint (with tokenizer)")
    ap.add_argument("--prompt", default="the river 12 runs past")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quantize", choices=["q8_0"])
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ck = args.checkpoint or tiny_checkpoint(root)
        dtype = None if args.quantize else torch.float32
        out = export_gguf(ck, root / "model.gguf", dtype=dtype, quantize=args.quantize)
        ids = Tokenizer.load(ck).encode(args.prompt, add_special_tokens=True)
        ours = astrai_greedy(ck, ids, args.tokens)
        theirs, tps = llama_cpp_greedy(out, ids, args.tokens, args.threads)
    diff = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    print(f"astrai    : {ours}")
    print(f"llama.cpp : {theirs}")
    print(f"first difference: {'none' if diff is None else diff}; llama.cpp decode "
          f"{tps:.1f} tokens/s on {args.threads} thread(s)")


if __name__ == "__main__":
    main()
