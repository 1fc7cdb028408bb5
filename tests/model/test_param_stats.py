"""Parameter counts, FLOPs per token and weight memory against the model itself."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from astrai.model import PRESETS, ForwardContext, ModelConfig, Transformer, get_preset
from astrai.model.stats import (
    flops_per_token,
    matmul_params,
    model_stats,
    param_counts,
    weight_memory,
)

VARIANTS = {
    "dense": {},
    "tied+bias": {"tie_embeddings": True, "qkv_bias": True},
    "moe": {"n_layers": 3, "n_experts": 4, "moe_top_k": 2, "n_shared_experts": 1,
            "moe_layers": [0, 2]},
    "head_dim": {"head_dim": 12, "n_kv_heads": 1},
    "qk_norm": {"qk_norm": True, "head_dim": 12},
}


def component(name: str) -> str:
    if name.startswith("embed_tokens"):
        return "embedding"
    if name.startswith("lm_head"):
        return "lm_head"
    if name.endswith("norm.weight"):
        return "norms"
    if ".attn." in name:
        return "attention"
    return "router" if ".router." in name else "mlp"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_counts_by_component_match_the_model(variant, make_config):
    c = make_config(**VARIANTS[variant])
    model = Transformer(c)
    want = dict.fromkeys(("embedding", "attention", "mlp", "router", "norms", "lm_head"), 0)
    for name, p in model.named_parameters():
        want[component(name)] += p.numel()
    counts = param_counts(c)
    assert {k: v for k, v in counts.as_dict().items() if k in want} == want
    assert counts.total == sum(p.numel() for p in model.parameters())
    if c.n_experts:  # two MoE layers, each skipping (E - k) experts of 3*C*F weights per token
        assert counts.active == counts.total - 2 * (4 - 2) * 3 * c.dim * c.ffn_dim
    else:
        assert counts.active == counts.total


@pytest.mark.parametrize("name", list(PRESETS))
def test_full_size_presets_on_meta_device(name):
    c = get_preset(name)
    with torch.device("meta"):
        model = Transformer(c)
    assert param_counts(c).total == sum(p.numel() for p in model.parameters())


def test_preset_sizes_are_as_advertised():
    approx = {"tiny": 7e6, "small": 58e6, "125m": 117e6, "1.2b": 1.2e9}
    for name, n in approx.items():
        assert param_counts(get_preset(name)).total == pytest.approx(n, rel=0.05), name


class MatmulBackend:
    """Causal attention as two explicit matmuls, so FlopCounterMode sees them (it does not
    count the CPU SDPA kernel)."""

    name = "matmul"

    def attend(self, q, k, v, layer, ctx):
        H, K, T = q.shape[2], k.shape[2], q.shape[1]
        k, v = (t.repeat_interleave(H // K, dim=2) for t in (k, v))  # (B, T, H, D)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5  # (B, H, T, T)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        p = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        return (p @ v).transpose(1, 2)  # (B, T, H, D)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_forward_flops_match_torch_flop_counter(variant, make_config):
    # FlopCounterMode counts 2*m*n*k per matmul: the PaLM forward convention, with full
    # T x T attention scores and only the MoE experts each token visits.
    c = make_config(**VARIANTS[variant])
    model = Transformer(c).eval()
    T = 16
    ids = torch.randint(0, c.vocab_size, (1, T))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        out = model(ids, ForwardContext(backend=MatmulBackend()))
    assert counter.get_total_flops() == flops_per_token(c, T, training=False) * T
    with torch.no_grad():
        torch.testing.assert_close(out.logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def test_flops_closed_form_and_sliding_window(make_config):
    c = make_config(sliding_window=8)
    N = matmul_params(c)
    C, H, K, D, F, V, L = 32, 4, 2, 8, 48, 97, 2
    assert N == L * (C * H * D + 2 * C * K * D + H * D * C + 3 * C * F) + V * C
    assert flops_per_token(c, 100, training=False) == 2 * N + 4 * L * H * D * 8  # min(T, W)
    assert flops_per_token(c, 4) == 3 * (2 * N + 4 * L * H * D * 4)
    assert flops_per_token(c) == flops_per_token(c, c.max_seq_len)


def test_weight_memory_matches_tensor_bytes(make_config):
    c = make_config(tie_embeddings=True)
    mem = weight_memory(c)
    for key, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = Transformer(c).to(dtype)
        assert mem[key] == sum(p.numel() * p.element_size() for p in model.parameters())


def test_model_stats_is_json_ready():
    import json

    stats = model_stats(ModelConfig(), seq_len=128)
    assert json.loads(json.dumps(stats)) == stats
    assert stats["flops_per_token"]["seq_len"] == 128
