"""The one declaration of what each ModelConfig field does to the forward pass.

Every executor of the model — the Python blocks (`Transformer.forward`), the native CPU step
(astrai/infer/native_step.py, a C++ twin of the blocks), the static decode step and the
exporters (GGUF: astrai.model.gguf_names, HF: astrai.model.hf_config) — reads a model through this table, so a new config value can never be silently
ignored by one of them:

* `shape`   sizes every executor takes from the config or the weights;
* `rope`    enters through the model's own RoPE tables (`rope_cos`/`rope_sin`), which every
            executor reads as they are: any value is served everywhere;
* `feature` changes the computation: an executor serves a model only when it declares the
            field and accepts its value (`refusal`); a field it does not declare refuses;
* `init`    initialisation only; `training` the loss only: neither changes a forward pass.

A field added to ModelConfig (or RopeScaling) without a role here fails
tests/model/test_features.py; one given the role `feature` is refused by every executor
until that executor declares it — an executor falls back to the eager path (which is the
Python forward, always right), never to a wrong answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from astrai.model.config import ModelConfig

ROLES: dict[str, str] = {
    "vocab_size": "shape", "dim": "shape", "n_layers": "shape", "n_heads": "shape",
    "n_kv_heads": "shape", "head_dim": "shape", "ffn_dim": "shape", "max_seq_len": "shape",
    "rope_theta": "rope", "rope_scaling": "rope",
    "norm_eps": "feature", "tie_embeddings": "feature", "qkv_bias": "feature",
    "qk_norm": "feature", "sliding_window": "feature",
    "n_experts": "feature", "moe_top_k": "feature", "n_shared_experts": "feature",
    "moe_layers": "feature",
    "moe_aux_loss_coef": "training",
    "init_std": "init", "zero_init_proj": "init",
}
"""ModelConfig field -> role (module docstring)."""

ROPE_SCALING_FIELDS = frozenset({
    "type", "factor", "original_max_position_embeddings", "low_freq_factor",
    "high_freq_factor", "beta_fast", "beta_slow", "attention_factor"})
"""RopeScaling's fields: all enter through the RoPE tables (role `rope`)."""

Accepts = Callable[[Any, int], bool]
"""(the field's value, the context the executor serves) -> served?"""

ANY: Accepts = lambda value, context: True


def only(*values: Any) -> Accepts:
    """Accepts exactly `values`."""
    return lambda value, context: value in values


def window_covers_context(value: Any, context: int) -> bool:
    """A sliding window no narrower than the context attends like full causal attention."""
    return value is None or value >= context


def forward_features(config: ModelConfig) -> dict[str, Any]:
    """The values of the fields that change the computation (role `feature`)."""
    return {name: getattr(config, name) for name, role in ROLES.items() if role == "feature"}


def refusal(config: ModelConfig, declared: Mapping[str, Accepts], context: int,
            executor: str, reasons: Mapping[str, str] | None = None) -> str | None:
    """Why `executor`, which declares the features `declared`, cannot serve `config` at
    `context` tokens, or None: every feature declared, and its value accepted. `reasons`:
    field -> the line to give instead when its value is refused (what to do about it)."""
    for name, value in forward_features(config).items():
        accepts = declared.get(name)
        if accepts is None:
            return f"{name}={value!r} is a model feature the {executor} does not declare"
        if not accepts(value, context):
            return (reasons or {}).get(name) or f"{name}={value!r} is not served by the {executor}"
    return None
