"""The names of a Llama-family state dict in HF's layout and in astrai's, both ways.

HF's Llama, Qwen2, Qwen3 and Mistral share one layout (`model.layers.{i}.self_attn.q_proj`),
which maps to astrai's (`layers.{i}.attn.q_proj`) by name alone.
"""

from __future__ import annotations

import re

from astrai.errors import UnsupportedModelError

# (HF name pattern, astrai name template); {i} is the layer index.
_LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "mlp_norm.weight",
    **{f"self_attn.{p}_proj.{w}": f"attn.{p}_proj.{w}"
       for p in ("q", "k", "v", "o") for w in ("weight", "bias")},
    **{f"mlp.{p}_proj.weight": f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")},
    # Qwen3's QK-norm gains
    "self_attn.q_norm.weight": "attn.q_norm.weight",
    "self_attn.k_norm.weight": "attn.k_norm.weight",
}
_TOP_MAP = {"model.embed_tokens.weight": "embed_tokens.weight", "model.norm.weight": "norm.weight",
            "lm_head.weight": "lm_head.weight"}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def hf_to_astrai_name(name: str) -> str | None:
    """astrai state-dict name for a HF tensor name; None for tensors astrai recomputes
    (old checkpoints store `rotary_emb.inv_freq`). Unknown names pass through unchanged so
    the shape check lists them as unexpected."""
    if name.endswith("rotary_emb.inv_freq"):
        return None
    if name in _TOP_MAP:
        return _TOP_MAP[name]
    m = _LAYER_RE.match(name)
    if m and m.group(2) in _LAYER_MAP:
        return f"layers.{m.group(1)}.{_LAYER_MAP[m.group(2)]}"
    return name


def astrai_to_hf_name(name: str) -> str:
    inverse_top = {v: k for k, v in _TOP_MAP.items()}
    if name in inverse_top:
        return inverse_top[name]
    m = re.match(r"^layers\.(\d+)\.(.+)$", name)
    inverse_layer = {v: k for k, v in _LAYER_MAP.items()}
    if m and m.group(2) in inverse_layer:
        return f"model.layers.{m.group(1)}.{inverse_layer[m.group(2)]}"
    raise UnsupportedModelError(f"tensor '{name}' has no HF Llama/Qwen2/Qwen3/Mistral name")
