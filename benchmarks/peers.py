"""The HF transformers peers the benchmarks measure against, built from astrai models."""

from __future__ import annotations

from pathlib import Path

import torch

from astrai.model.checkpoint import save_checkpoint
from astrai.model.config import ModelConfig
from astrai.model.hf import export_hf


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


def hf_llama(c: ModelConfig, seed: int = 0):
    """A freshly initialised LlamaForCausalLM (sdpa, no KV cache) of the shape of `c`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.dim, intermediate_size=c.ffn_dim,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
        num_key_value_heads=c.kv_heads, head_dim=c.hdim, max_position_embeddings=c.max_seq_len,
        rms_norm_eps=c.norm_eps, rope_theta=c.rope_theta, tie_word_embeddings=c.tie_embeddings,
        attention_bias=False, mlp_bias=False, use_cache=False,
    )
    hf._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return LlamaForCausalLM(hf)
