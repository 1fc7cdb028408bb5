"""The speed models of cpu_decode.py: one random-weight checkpoint per shape, its GGUF exports
(`astrai export --format gguf`'s function) and astrai's engines over the same weights, with
each format's bytes per token and the read bandwidth that bounds it."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path

import cpu_decode_astrai as ours
import torch

CORPUS = Path(__file__).resolve().parent.parent / "astrai" / "assets" / "tiny_corpus.txt"
# TinyLlama-1.1B's shape (1.1B parameters); the vocabulary is 125m's 32,000 as in TinyLlama
ONE_B = {"vocab_size": 32000, "dim": 2048, "n_layers": 22, "n_heads": 32, "n_kv_heads": 4,
         "head_dim": 64, "ffn_dim": 5632, "max_seq_len": 2048, "norm_eps": 1e-5,
         "tie_embeddings": False}
LLAMA_FORMAT = {"fp32": ("f32", {"dtype": torch.float32}),
                "bf16": ("bf16", {"dtype": torch.bfloat16}),
                "int8": ("q8_0", {"quantize": "q8_0"}),
                "int4": ("q4_0", {"quantize": "q4_0"})}


@dataclass(frozen=True)
class Job:
    shape: str
    tool: str  # "astrai" or "llama.cpp"
    fmt: str  # astrai's name: fp32, bf16, int8, int4 (llama.cpp's f32, bf16, q8_0, q4_0)
    setting: str  # "b1", "b4", "contended", "b1-4k" (astrai with 4 KiB pages)


@dataclass
class Results:
    pp: dict[Job, list[float]] = field(default_factory=dict)
    tg: dict[Job, list[float]] = field(default_factory=dict)
    errors: dict[Job, str] = field(default_factory=dict)


@dataclass
class Shape:
    name: str
    params: int
    concurrent: bool
    """Whether the 4-concurrent and contention settings run on this shape."""
    prompts: ours.Prompts
    engines: dict = field(default_factory=dict)
    engines_4k: dict = field(default_factory=dict)
    """astrai with the weights left in ordinary 4 KiB pages (llama.cpp's page policy)."""
    ggufs: dict[str, Path] = field(default_factory=dict)
    bytes: dict[tuple[str, str], int] = field(default_factory=dict)
    """(tool, astrai format) -> weight bytes one token reads."""
    bandwidth: dict[int, float] = field(default_factory=dict)
    llama_conditions: str = ""

    def floor(self, tool: str, fmt: str) -> float | None:
        """tok/s of a decoder that only reads its weights once per token at the bandwidth."""
        n = self.bytes.get((tool, fmt))
        return None if n is None else self.bandwidth[n] / n

    def remeasure(self) -> None:
        """Bandwidth again at every size, the higher kept (the machine's load moves it)."""
        for n in self.bandwidth:
            self.bandwidth[n] = max(self.bandwidth[n], read_bandwidth(n))


def read_bandwidth(nbytes: int) -> float:
    """Bytes/s of a streaming fp32 sum over a buffer of `nbytes` (best of 8) with torch's
    threads: DRAM for a buffer far larger than the caches, partly the last-level cache for
    one about its size (a format that fits the L3 is read from it)."""
    x = torch.ones(max(nbytes, 2**20) // 4)
    x.sum()
    best = float("inf")
    for _ in range(8):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best


def gguf_bytes(path: Path) -> int:
    """The tensor bytes of a GGUF: what llama.cpp reads per token (a tied output matrix is
    the embedding table, read whole)."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors)


def bytes_per_token(model: torch.nn.Module) -> int:
    """Weight bytes one decode step of astrai reads: every block and head weight once (with
    its scales), the gains, one embedding row (a tied fp32 head reads the whole table)."""
    total = 0
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if "rope" in name or name.endswith("scale_bf16"):
            continue
        if name.endswith("embed_tokens.weight"):
            head_reads_it = getattr(model, "lm_head", None) is None
            total += (t.numel() if head_reads_it else t.shape[1]) * t.element_size()
            continue
        total += t.numel() * t.element_size()
    return total


def has_bf16_hardware() -> bool:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    return "amx_bf16" in flags or "avx512_bf16" in flags


def checkpoint(work: Path, name: str) -> tuple[torch.nn.Module, Path]:
    """A random-weight model of `name` saved with a small byte-level BPE (so its GGUF carries
    a tokenizer; ids the BPE lacks are placeholders: the prompts are ids)."""
    from astrai.data.bpe import train_tokenizer
    from astrai.model import build_model, get_preset
    from astrai.model.checkpoint import save_checkpoint

    tok = work / "tok"
    if not tok.is_dir():
        train_tokenizer([CORPUS], 512, tok)
    config = get_preset("125m" if name == "125m" else "1.2b",
                        **({} if name == "125m" else ONE_B), init_std=0.1)
    model = build_model(config, seed=0).eval()
    save_checkpoint(work / name, model, config, tokenizer_dir=tok, meta={"step": 0})
    return model, work / name


def astrai_format(model: torch.nn.Module, fmt: str) -> torch.nn.Module:
    from astrai.model.quant import quantize_model

    if fmt == "bf16":
        return model.to(torch.bfloat16)
    return model if fmt == "fp32" else quantize_model(model, fmt)


def build_shape(name: str, fmts: list[str], work: Path, concurrent: bool) -> Shape:
    """Exports first (from the saved checkpoint), then astrai's formats from the model in
    memory (the fp32 model is converted last, in place, to bound the memory of 1b)."""
    from astrai.model.gguf_export import export_gguf

    model, ckpt = checkpoint(work, name)
    s = Shape(name, sum(p.numel() for p in model.parameters()), concurrent,
              ours.Prompts(model.config.vocab_size, seed=1))
    for fmt in fmts:
        theirs, kw = LLAMA_FORMAT[fmt]
        s.ggufs[fmt] = export_gguf(ckpt, work / f"{name}-{theirs}.gguf", **kw)
        s.bytes[("llama.cpp", fmt)] = gguf_bytes(s.ggufs[fmt])
    order = sorted(fmts, key=lambda f: f == "fp32")  # the copies first, fp32 itself last
    for i, fmt in enumerate(order):
        m = astrai_format(model if i == len(order) - 1 else copy.deepcopy(model), fmt)
        if concurrent:  # both page policies on the small shape
            s.engines_4k[fmt] = ours.engine(copy.deepcopy(m), huge_pages=False)
            ours.warm_up(s.engines_4k[fmt], s.prompts)
        s.engines[fmt] = ours.engine(m, huge_pages=True)
        ours.warm_up(s.engines[fmt], s.prompts)
        s.bytes[("astrai", fmt)] = bytes_per_token(m)  # as the engine laid them out
    del model
    for n in set(s.bytes.values()):
        s.bandwidth[n] = read_bandwidth(n)
    return s
