"""The HF transformers peers the benchmarks measure against, built from astrai models."""

from __future__ import annotations

from pathlib import Path

import torch

from astrai.model.checkpoint import save_checkpoint
from astrai.model.config import ModelConfig
from astrai.model.hf_export import export_hf


def hf_twin(model, tmp: Path):
    """The same weights as a transformers LlamaForCausalLM with sdpa attention (exported
    through `tmp`), eval mode, generating with pad id 0 and no EOS."""
    import transformers

    save_checkpoint(tmp / "ckpt", model, model.config)
    export_hf(tmp / "ckpt", tmp / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp / "hf", attn_implementation="sdpa", dtype=torch.float32).eval()
    hf.generation_config.pad_token_id = 0
    hf.generation_config.eos_token_id = None
    return hf


def hf_shape(c: ModelConfig) -> dict:
    """The transformers config keywords of `c`'s shape shared by Llama and Qwen3 (no
    biases, no KV cache)."""
    return {
        "vocab_size": c.vocab_size, "hidden_size": c.dim, "intermediate_size": c.ffn_dim,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.kv_heads, "head_dim": c.hdim,
        "max_position_embeddings": c.max_seq_len, "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_theta, "tie_word_embeddings": c.tie_embeddings,
        "attention_bias": False, "use_cache": False,
    }


def hf_llama(c: ModelConfig, seed: int = 0):
    """A freshly initialised LlamaForCausalLM (sdpa, no KV cache) of the shape of `c`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaConfig(**hf_shape(c), mlp_bias=False)
    hf._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return LlamaForCausalLM(hf)


def hf_causal_lm(c: ModelConfig, seed: int = 0):
    """A freshly initialised transformers model of the shape of `c` (sdpa, no KV cache):
    Qwen3ForCausalLM when `c` normalises q and k per head (Qwen3's q_norm / k_norm),
    else LlamaForCausalLM. `zero_init_proj` is mirrored (o_proj and down_proj start at 0)."""
    if not c.qk_norm:
        hf = hf_llama(c, seed)
    else:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        cfg = Qwen3Config(**hf_shape(c), use_sliding_window=False)
        cfg._attn_implementation = "sdpa"
        torch.manual_seed(seed)
        hf = Qwen3ForCausalLM(cfg)
    if c.zero_init_proj:
        with torch.no_grad():
            for layer in hf.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
    return hf
