"""Planted checkpoints for tests and benchmarks: known lock-in, overflow, NaNs, frozen subsets.

The paper's own totals do not add up (35,328 + 36,864 + 1,536 + 5,928 != 73,536), so the
inspection is tested against checkpoints whose damage we planted and therefore know exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from astrai.model import ModelConfig, build_model
from astrai.model.checkpoint import save_checkpoint


def tiny_config(**overrides) -> ModelConfig:
    """4 layers, d=64, GQA 4/2 heads of 16, ffn 128, vocab 512: k_proj is 32x64."""
    base = {"vocab_size": 512, "dim": 64, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2,
            "head_dim": 16, "ffn_dim": 128, "max_seq_len": 64}
    return ModelConfig(**{**base, **overrides})


def fresh_state(config: ModelConfig, seed: int = 0,
                dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """A residual-scaled random init (norm gains exactly 1.0), cloned so it can be edited."""
    model = build_model(config, seed=seed, dtype=dtype)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@dataclass(frozen=True)
class Planted:
    """What `plant_lockin` did, for assertions."""

    k_layers: tuple[int, ...] = (1, 2, 3)
    k_rows: tuple[int, int] = (6, 7)
    """k_proj rows set to exactly 1.0 (inclusive range) in k_layers (paper: W_k rows 6-7)."""
    down_row: int = 1
    down_cols: tuple[int, int] = (40, 99)
    down_value: float = -0.5
    """down_proj row 1, cols 40-99 set to -0.5 in every layer (paper: row 1, cols 3164-4699)."""
    head_row: int = 3
    head_value: float = 0.75
    """One whole LM-head row set to 0.75."""
    embed_rows: tuple[int, int] = (0, 3)
    embed_cols: int = 40
    embed_value: float = 2e37
    """Embedding rows 0-3, first 40 dims overflowed to 2e37 (paper: tokens 0-7)."""
    nan_layer: int = 2
    nan_at: tuple[tuple[int, int], ...] = ((5, 7), (5, 8), (90, 3))
    """NaNs in layers.{nan_layer}.mlp.up_proj.weight."""

    def counts(self, config: ModelConfig) -> dict[str, int]:
        """Exact entries planted per finding."""
        return {
            "k_proj": len(self.k_layers) * (self.k_rows[1] - self.k_rows[0] + 1) * config.dim,
            "down_proj": config.n_layers * (self.down_cols[1] - self.down_cols[0] + 1),
            "lm_head": config.dim,
            "embed": (self.embed_rows[1] - self.embed_rows[0] + 1) * self.embed_cols,
            "nan": len(self.nan_at),
        }


def plant_lockin(state: dict[str, torch.Tensor], config: ModelConfig,
                 p: Planted = Planted()) -> dict[str, torch.Tensor]:
    """Plant the paper's pathologies into an astrai state dict (in place; returned)."""
    with torch.no_grad():
        for i in p.k_layers:
            state[f"layers.{i}.attn.k_proj.weight"][p.k_rows[0]: p.k_rows[1] + 1] = 1.0
        for i in range(config.n_layers):
            w = state[f"layers.{i}.mlp.down_proj.weight"]
            w[p.down_row, p.down_cols[0]: p.down_cols[1] + 1] = p.down_value
        state["lm_head.weight"][p.head_row] = p.head_value
        state["embed_tokens.weight"][p.embed_rows[0]: p.embed_rows[1] + 1, : p.embed_cols] = \
            p.embed_value
        up = state[f"layers.{p.nan_layer}.mlp.up_proj.weight"]
        for r, c in p.nan_at:
            up[r, c] = float("nan")
    return state


def write_checkpoint(path: str | Path, state: dict[str, torch.Tensor], config: ModelConfig,
                     meta: dict | None = None) -> Path:
    return save_checkpoint(path, state, config, meta=meta)


_HF_LAYER = {
    "attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
    "attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj",
    "attn.v_proj": "self_attn.v_proj", "attn.o_proj": "self_attn.o_proj",
}


def hf_name(name: str) -> str:
    """HF Llama tensor name of an astrai name (written here, independent of model/hf.py)."""
    if name in ("embed_tokens.weight", "norm.weight"):
        return "model." + name
    if name.startswith("layers."):
        _, i, rest = name.split(".", 2)
        for ours, theirs in _HF_LAYER.items():
            if rest.startswith(ours + "."):
                rest = theirs + rest[len(ours):]
        return f"model.layers.{i}.{rest}"
    return name


def write_hf_dir(path: str | Path, state: dict[str, torch.Tensor], config: ModelConfig,
                 shards: int = 1) -> Path:
    """A HF Llama-format directory: config.json + model.safetensors (or N shards + index)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    hf = {k: v.contiguous() for k, v in ((hf_name(k), v) for k, v in state.items())}
    cfg = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "vocab_size": config.vocab_size, "hidden_size": config.dim,
        "intermediate_size": config.ffn_dim, "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads, "num_key_value_heads": config.kv_heads,
        "head_dim": config.hdim, "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.norm_eps, "rope_theta": config.rope_theta,
        "tie_word_embeddings": config.tie_embeddings, "torch_dtype": "float32",
    }
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    if shards == 1:
        save_file(hf, str(path / "model.safetensors"))
        return path
    names = list(hf)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: hf[n] for n in names[s::shards]}
        save_file(part, str(path / fname))
        weight_map.update({n: fname for n in part})
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path
