"""HF `config.json` ⇄ `ModelConfig` for the Llama, Qwen2, Qwen3 and Mistral families.

Only this module and `hf_names.py` know HF names (STYLE.md habit 8: convert at the boundary).
Both transformers layouts are read: 4.x (`rope_theta` + `rope_scaling` at top level) and
5.x (`rope_parameters` holding `rope_type`, `rope_theta` and the scaling keys). Exports
write both, so any transformers from 4.45 on reads them.

Anything astrai cannot reproduce exactly (o_proj / MLP biases, partial rotary, per-layer
sliding windows, longrope, quantised weights) is an `UnsupportedModelError`, never a
silent approximation.
"""

from __future__ import annotations

import math
from typing import Any

from astrai.errors import ConfigError, UnsupportedModelError
from astrai.model.config import ModelConfig, RopeScaling
from astrai.model.features import ANY, only, refusal

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM"}


def is_hf_config(data: dict) -> bool:
    """A HF config.json names its model_type; an astrai one never does."""
    return "model_type" in data or "architectures" in data


def config_from_hf(hf: dict[str, Any], source: str = "config.json",
                   ) -> tuple[ModelConfig, list[str]]:
    """(ModelConfig, notes) from a HF config dict; notes explain exact-but-lossy mappings."""
    mt = hf.get("model_type")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"{source}: model_type '{mt}' is not supported; astrai loads "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} checkpoints"
        )
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads"):
        if not isinstance(hf.get(key), int):
            raise ConfigError(f"{source}: '{key}' is missing or not an integer")
    _reject_unsupported(hf, mt, source)
    notes: list[str] = []
    theta, scaling = _rope_from_hf(hf, source, notes)
    heads = hf["num_attention_heads"]
    data = {
        "vocab_size": hf["vocab_size"],
        "dim": hf["hidden_size"],
        "n_layers": hf["num_hidden_layers"],
        "n_heads": heads,
        "n_kv_heads": hf.get("num_key_value_heads") or heads,
        "head_dim": hf.get("head_dim") or None,
        "ffn_dim": hf["intermediate_size"],
        "max_seq_len": hf.get("max_position_embeddings") or 2048,
        "rope_theta": theta,
        "rope_scaling": scaling,
        "norm_eps": hf.get("rms_norm_eps", 1e-6),
        "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
        "qkv_bias": mt == "qwen2",
        "qk_norm": mt == "qwen3",
        "sliding_window": _sliding_window(hf, mt, source),
        "init_std": hf.get("initializer_range", 0.02),
    }
    return ModelConfig.from_dict(data, source=source), notes


def _reject_unsupported(hf: dict, mt: str, source: str) -> None:
    def no(what: str) -> UnsupportedModelError:
        return UnsupportedModelError(f"{source}: {what} is not supported by astrai's {mt} loader")

    if hf.get("hidden_act", "silu") not in ("silu", "swish"):
        raise no(f"hidden_act '{hf.get('hidden_act')}' (only silu / SwiGLU)")
    if hf.get("quantization_config"):
        raise no("a quantized checkpoint (quantization_config)")
    if hf.get("mlp_bias"):
        raise no("mlp_bias")
    if mt in ("llama", "qwen3") and hf.get("attention_bias"):
        raise no("attention_bias (astrai has q/k/v biases only, not an o_proj bias)")
    rp = hf.get("rope_parameters") if isinstance(hf.get("rope_parameters"), dict) else {}
    prf = hf.get("partial_rotary_factor", rp.get("partial_rotary_factor", 1.0))
    if prf not in (None, 1, 1.0):
        raise no(f"partial_rotary_factor {prf}")


def _rope_dict(hf: dict, source: str) -> dict:
    # transformers 5.x: rope_scaling (legacy) wins over rope_parameters when both exist.
    d = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if not isinstance(d, dict):
        raise ConfigError(f"{source}: rope_scaling / rope_parameters must be an object")
    nested = [v for v in d.values() if isinstance(v, dict)]
    if nested:  # per-layer-type parameters: fine only when every layer type agrees
        if any(v != nested[0] for v in nested):
            raise UnsupportedModelError(
                f"{source}: different RoPE parameters per layer type are not supported"
            )
        d = nested[0]
    return dict(d)


def _rope_from_hf(hf: dict, source: str, notes: list[str]) -> tuple[float, RopeScaling]:
    d = _rope_dict(hf, source)
    rp = hf.get("rope_parameters") if isinstance(hf.get("rope_parameters"), dict) else {}
    theta = d.get("rope_theta") or hf.get("rope_theta") or rp.get("rope_theta") or 10000.0
    rtype = d.get("rope_type") or d.get("type") or "default"
    max_pos = hf.get("max_position_embeddings") or 2048
    # Phi3-style configs keep the pre-training length at top level; HF gives it priority.
    orig = hf.get("original_max_position_embeddings") or d.get("original_max_position_embeddings")
    orig = orig or max_pos
    if rtype == "default":
        return float(theta), RopeScaling()
    if rtype == "linear":
        return float(theta), RopeScaling(type="linear", factor=float(d["factor"]))
    if rtype == "dynamic":
        # HF's dynamic NTK recomputes the base only once a sequence grows past
        # max_position_embeddings; below that it is plain RoPE, and astrai's RoPE table stops
        # at max_position_embeddings, so plain RoPE is exact over every length astrai runs.
        notes.append(
            f"rope_type 'dynamic' loaded as plain RoPE: identical up to {max_pos} positions, "
            "which is as far as astrai's RoPE table goes"
        )
        return float(theta), RopeScaling()
    if rtype == "llama3":
        return float(theta), RopeScaling(
            type="llama3", factor=float(d["factor"]),
            low_freq_factor=float(d.get("low_freq_factor", 1.0)),
            high_freq_factor=float(d.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(orig),
        )
    if rtype == "yarn":
        if d.get("truncate", True) is False:
            raise UnsupportedModelError(f"{source}: yarn with truncate=false is not supported")
        factor = d.get("factor") or max_pos / orig
        attn = d.get("attention_factor")
        if attn is None and d.get("mscale") and d.get("mscale_all_dim"):
            attn = _yarn_mscale(factor, d["mscale"]) / _yarn_mscale(factor, d["mscale_all_dim"])
        return float(theta), RopeScaling(
            type="yarn", factor=float(factor), original_max_position_embeddings=int(orig),
            beta_fast=float(d.get("beta_fast") or 32.0), beta_slow=float(d.get("beta_slow") or 1.0),
            attention_factor=None if attn is None else float(attn),
        )
    raise UnsupportedModelError(
        f"{source}: rope_type '{rtype}' is not supported (astrai reads default, linear, "
        "dynamic, llama3 and yarn)"
    )


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _sliding_window(hf: dict, mt: str, source: str) -> int | None:
    if mt == "mistral":
        return hf.get("sliding_window") or None
    if mt not in ("qwen2", "qwen3") or not hf.get("use_sliding_window"):
        return None
    window = hf.get("sliding_window")
    n = hf["num_hidden_layers"]
    types = hf.get("layer_types") or [
        "sliding_attention" if i >= hf.get("max_window_layers", 28) else "full_attention"
        for i in range(n)
    ]
    if all(t == "full_attention" for t in types) or not window:
        return None
    if all(t == "sliding_attention" for t in types):
        return int(window)
    raise UnsupportedModelError(
        f"{source}: sliding-window attention on only some layers (max_window_layers="
        f"{hf.get('max_window_layers')}) is not supported; astrai applies one window to all layers"
    )


# -- export -------------------------------------------------------------------------------

HF_FEATURES = {
    "norm_eps": ANY, "tie_embeddings": ANY,  # rms_norm_eps, tie_word_embeddings
    "qkv_bias": ANY, "qk_norm": ANY,          # the qwen2 / qwen3 model types
    "sliding_window": ANY,                    # mistral's / qwen's sliding_window
    "n_experts": only(0), "n_shared_experts": only(0), "moe_top_k": ANY, "moe_layers": ANY,
}
"""The model features the HF Llama / Qwen2 / Qwen3 / Mistral configs written here hold
(astrai.model.features); a feature not declared here is refused, never dropped."""

HF_DENSE_ONLY = ("mixture-of-experts models cannot be exported to HF format (no Llama/Qwen2/"
                 "Qwen3/Mistral equivalent); export a dense model")


def config_to_hf(c: ModelConfig, dtype: str = "float32", family: str | None = None
                 ) -> dict[str, Any]:
    """HF config.json for `c`: qwen3 when it has QK-norm, qwen2 when it has q/k/v biases,
    mistral when it has a sliding window or `family` (the source's model_type) is mistral,
    llama otherwise. MoE, and QK-norm with q/k/v biases, have no HF counterpart here and are
    refused, as is any feature HF_FEATURES does not declare."""
    why = refusal(c, HF_FEATURES, c.max_seq_len, "HF export",
                  {"n_experts": HF_DENSE_ONLY, "n_shared_experts": HF_DENSE_ONLY})
    if why is not None:
        raise UnsupportedModelError(why)
    if c.qk_norm and c.qkv_bias:
        raise UnsupportedModelError(
            "qk_norm with qkv_bias cannot be exported to HF format: Qwen3 (the HF model with "
            "QK-norm) has attention biases only together with an o_proj bias; train with one "
            "of qk_norm, qkv_bias"
        )
    mt = ("qwen3" if c.qk_norm else "qwen2" if c.qkv_bias
          else "mistral" if c.sliding_window or family == "mistral" else "llama")
    theta, rope = rope_to_hf(c)
    out: dict[str, Any] = {
        "architectures": [ARCHITECTURES[mt]],
        "model_type": mt,
        "vocab_size": c.vocab_size,
        "hidden_size": c.dim,
        "intermediate_size": c.ffn_dim,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.kv_heads,
        "head_dim": c.hdim,
        "hidden_act": "silu",
        "max_position_embeddings": c.max_seq_len,
        "rms_norm_eps": c.norm_eps,
        "tie_word_embeddings": c.tie_embeddings,
        "initializer_range": c.init_std,
        "attention_dropout": 0.0,
        "use_cache": True,
        # 4.x reads rope_theta + rope_scaling, 5.x rope_parameters; both say the same thing.
        "rope_theta": theta,
        "rope_scaling": rope,
        "rope_parameters": {"rope_type": "default", **(rope or {}), "rope_theta": theta},
        "torch_dtype": dtype,
        "dtype": dtype,
    }
    if mt == "llama":
        out.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    elif mt == "mistral":
        out.update(sliding_window=c.sliding_window)
    else:  # qwen2 / qwen3: one window for every layer = sliding from layer 0
        out.update(use_sliding_window=c.sliding_window is not None,
                   sliding_window=c.sliding_window,
                   max_window_layers=0 if c.sliding_window else c.n_layers)
        if mt == "qwen3":
            out.update(attention_bias=False)
    return out


def rope_to_hf(c: ModelConfig) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling dict or None) with HF semantics equal to astrai's table."""
    s, theta = c.rope_scaling, float(c.rope_theta)
    if s.type == "none" or (s.type != "yarn" and s.factor == 1.0):
        return theta, None
    if s.type == "linear":
        return theta, {"rope_type": "linear", "factor": s.factor}
    if s.type == "ntk":
        # Static NTK-aware scaling is a base change, theta' = theta * f^(d/(d-2)): plain RoPE in HF.
        d = c.hdim
        return theta * s.factor ** (d / (d - 2)), None
    if s.type == "llama3":
        return theta, {
            "rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings or 8192,
        }
    # yarn: write the attention factor explicitly so no default can differ.
    attn = s.attention_factor if s.attention_factor is not None else _yarn_mscale(s.factor)
    return theta, {
        "rope_type": "yarn", "factor": s.factor, "beta_fast": s.beta_fast,
        "beta_slow": s.beta_slow, "attention_factor": attn,
        "original_max_position_embeddings": s.original_max_position_embeddings or 4096,
    }
