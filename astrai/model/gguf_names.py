"""astrai's state-dict names in llama.cpp's GGUF layout, the architecture a config maps to,
and the q/k row permutation llama.cpp's `llama` architecture expects.

llama.cpp names tensors `blk.{i}.attn_q.weight`, `token_embd.weight`, ... (the GGUF spec,
"Standardized tensor names"). Its `llama` architecture rotates interleaved pairs (dimension
2j with 2j+1, RoPE "normal" mode) while astrai — like HF — rotates halves (j with j + D/2,
docs/architecture.md); so llama's q and k rows are permuted per head. `qwen2` and `qwen3`
use llama.cpp's NeoX mode, which rotates halves, and take the rows as they are.
"""

from __future__ import annotations

import re

import torch

from astrai.errors import UnsupportedModelError
from astrai.model.config import ModelConfig
from astrai.model.features import ANY, only, refusal

_LAYER = {
    "attn_norm.weight": "attn_norm.weight",
    "mlp_norm.weight": "ffn_norm.weight",
    **{f"attn.{p}_proj.{w}": f"attn_{g}.{w}" for p, g in
       (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output")) for w in ("weight", "bias")},
    "attn.q_norm.weight": "attn_q_norm.weight",
    "attn.k_norm.weight": "attn_k_norm.weight",
    **{f"mlp.{p}_proj.weight": f"ffn_{p}.weight" for p in ("gate", "up", "down")},
}
_TOP = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}
_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")


GGUF_FEATURES = {
    "norm_eps": ANY, "tie_embeddings": ANY,  # {arch}.attention.layer_norm_rms_epsilon; no output.weight
    "qkv_bias": ANY, "qk_norm": ANY,          # the qwen2 / qwen3 architectures
    "sliding_window": ANY,                    # caps {arch}.context_length (gguf_export)
    "n_experts": only(0), "n_shared_experts": only(0), "moe_top_k": ANY, "moe_layers": ANY,
}
"""The model features a GGUF file of llama.cpp's dense llama, qwen2 and qwen3 architectures
holds (astrai.model.features); a feature not declared here is refused, never dropped."""

DENSE_ONLY = ("mixture-of-experts models cannot be exported to GGUF (astrai maps only the "
              "dense llama, qwen2 and qwen3 architectures); export a dense model")


def gguf_arch(c: ModelConfig) -> str:
    """llama.cpp's architecture for `c`: qwen3 with QK-norm, qwen2 with q/k/v biases, llama
    otherwise (Mistral included, as llama.cpp's own converter does). A feature GGUF_FEATURES
    does not serve (MoE), and QK-norm with biases, are refused."""
    why = refusal(c, GGUF_FEATURES, c.max_seq_len, "GGUF export",
                  {"n_experts": DENSE_ONLY, "n_shared_experts": DENSE_ONLY})
    if why is not None:
        raise UnsupportedModelError(why)
    if c.qk_norm and c.qkv_bias:
        raise UnsupportedModelError(
            "qk_norm with qkv_bias cannot be exported to GGUF: llama.cpp's qwen3 has QK-norm "
            "without q/k/v biases; train with one of qk_norm, qkv_bias")
    return "qwen3" if c.qk_norm else "qwen2" if c.qkv_bias else "llama"


def gguf_name(name: str) -> str:
    """llama.cpp's name of astrai tensor `name`."""
    if name in _TOP:
        return _TOP[name]
    m = _LAYER_RE.match(name)
    if m and m.group(2) in _LAYER:
        return f"blk.{m.group(1)}.{_LAYER[m.group(2)]}"
    raise UnsupportedModelError(f"tensor '{name}' has no GGUF llama/qwen2/qwen3 name")


def permute_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a q/k projection from rotate-half order to interleaved pairs, per head: row
    j and j + D/2 of each head become rows 2j and 2j+1 (what llama.cpp's converter calls
    `permute`)."""
    d = w.shape[0] // heads
    return (w.reshape(heads, 2, d // 2, *w.shape[1:])  # (H, 2, D/2, ...)
            .transpose(1, 2)                           # (H, D/2, 2, ...)
            .reshape(w.shape))


def unpermute_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of `permute_rows` (for tests and readers of llama-layout files)."""
    d = w.shape[0] // heads
    return (w.reshape(heads, d // 2, 2, *w.shape[1:])  # (H, D/2, 2, ...)
            .transpose(1, 2)                           # (H, 2, D/2, ...)
            .reshape(w.shape))


def gguf_tensors(state: dict[str, torch.Tensor], c: ModelConfig, arch: str
                 ) -> dict[str, torch.Tensor]:
    """`state` under llama.cpp's names, q/k rows permuted for `llama`; a tied model has no
    `output.weight` (llama.cpp then uses `token_embd.weight` for the output)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if c.tie_embeddings and name == "lm_head.weight":
            continue
        g = gguf_name(name)
        if arch == "llama" and g.endswith(("attn_q.weight", "attn_q.bias")):
            t = permute_rows(t, c.n_heads)
        elif arch == "llama" and g.endswith(("attn_k.weight", "attn_k.bias")):
            t = permute_rows(t, c.kv_heads)
        out[g] = t
    return out


_FROM_TOP = {g: a for a, g in _TOP.items()}
_FROM_LAYER = {g: a for a, g in _LAYER.items()}
_BLK_RE = re.compile(r"^blk\.(\d+)\.(.+)$")


def astrai_name(name: str) -> str | None:
    """astrai's name of llama.cpp tensor `name` (the inverse of `gguf_name`); None for a
    tensor astrai has no parameter for (`rope_freqs.weight`, read as RoPE scaling)."""
    if name in _FROM_TOP:
        return _FROM_TOP[name]
    m = _BLK_RE.match(name)
    if m and m.group(2) in _FROM_LAYER:
        return f"layers.{int(m.group(1))}.{_FROM_LAYER[m.group(2)]}"
    return None


def astrai_tensors(tensors: dict[str, torch.Tensor], c: ModelConfig, arch: str,
                   source: str = "GGUF file") -> dict[str, torch.Tensor]:
    """A GGUF file's tensors under astrai's names, q/k rows back in rotate-half order for
    `llama` (the inverse of `gguf_tensors`); `rope_freqs.weight` is left out (it is the
    config's RoPE scaling). A name astrai does not know is refused: dropping a tensor would
    run a different model."""
    out: dict[str, torch.Tensor] = {}
    for g, t in tensors.items():
        if g == "rope_freqs.weight":
            continue
        name = astrai_name(g)
        if name is None:
            raise UnsupportedModelError(f"{source}: tensor '{g}' has no astrai counterpart in "
                                        f"a dense {arch} model; astrai cannot run this file")
        if arch == "llama" and g.endswith(("attn_q.weight", "attn_q.bias")):
            t = unpermute_rows(t, c.n_heads)
        elif arch == "llama" and g.endswith(("attn_k.weight", "attn_k.bias")):
            t = unpermute_rows(t, c.kv_heads)
        out[name] = t
    return out
