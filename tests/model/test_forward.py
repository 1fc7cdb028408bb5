"""Forward pass: shapes per preset structure, causality, masks, GQA == MHA."""

from __future__ import annotations

import math

import pytest
import torch

from astrai.model import PRESETS, ForwardContext, ModelConfig, SdpaBackend
from astrai.model.context import attention_mask


def shrunk(name: str, **extra) -> ModelConfig:
    """The preset's structure (head ratio, tying, eps, theta) at a CPU-test size."""
    p = dict(PRESETS[name])
    H = p["n_heads"]
    small = {"vocab_size": 97, "dim": H * 8, "head_dim": 8, "n_layers": 2, "ffn_dim": 24,
             "max_seq_len": 32}
    return ModelConfig(**{**p, **small, **extra})


@pytest.mark.parametrize("name", list(PRESETS))
def test_forward_shapes_keep_the_preset_structure(name, make_model):
    full, c = ModelConfig(**PRESETS[name]), shrunk(name)
    assert c.n_heads // c.kv_heads == full.n_heads // full.kv_heads
    assert c.tie_embeddings == full.tie_embeddings
    model = make_model(c)
    ids = torch.randint(0, c.vocab_size, (2, 7))
    out = model(ids, return_hidden=True)
    assert out.logits.shape == (2, 7, 97) and out.hidden.shape == (2, 7, c.dim)
    assert out.aux_loss is None and torch.isfinite(out.logits).all()
    assert (model.lm_head is None) == full.tie_embeddings
    no_logits = model(ids, compute_logits=False, return_hidden=True)
    assert no_logits.logits is None
    torch.testing.assert_close(no_logits.hidden, out.hidden)


def test_moe_forward_shapes_and_aux(make_model):
    c = shrunk("tiny", n_experts=4, moe_top_k=2, n_shared_experts=1, moe_layers=[1])
    out = make_model(c)(torch.randint(0, 97, (2, 5)))
    assert out.logits.shape == (2, 5, 97)
    assert out.aux_loss.ndim == 0 and torch.isfinite(out.aux_loss) and out.aux_loss > 0


@pytest.mark.parametrize("extra", [
    {}, {"sliding_window": 3}, {"tie_embeddings": True, "qkv_bias": True}])
def test_causality_future_tokens_never_change_past_logits(extra, make_config, make_model):
    model = make_model(make_config(**extra))
    ids = torch.randint(0, 97, (2, 10))
    t = 6
    changed = ids.clone()
    changed[:, t:] = (ids[:, t:] + 1 + torch.randint(0, 90, (2, 10 - t))) % 97
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=0)
    assert (a[:, t] - b[:, t]).abs().max() > 1e-4  # the changed token itself is seen


def test_sliding_window_hides_tokens_outside_the_window(make_config, make_model):
    W = 3
    model = make_model(make_config(n_layers=1, sliding_window=W))  # one layer: no relaying
    ids = torch.randint(0, 97, (1, 10))
    t = 8
    with torch.no_grad():
        base = model(ids).logits[0, t]
        far, near = ids.clone(), ids.clone()
        far[0, t - W] = (ids[0, t - W] + 1) % 97  # outside (t-W+1 .. t)
        near[0, t - W + 1] = (ids[0, t - W + 1] + 1) % 97
        torch.testing.assert_close(model(far).logits[0, t], base, rtol=0, atol=0)
        assert (model(near).logits[0, t] - base).abs().max() > 1e-4


def test_packed_documents_equal_separate_runs(make_config, make_model):
    model = make_model(make_config())
    a, b = torch.randint(0, 97, (1, 5)), torch.randint(0, 97, (1, 4))
    packed = torch.cat([a, b], dim=1)
    ctx = ForwardContext(positions=torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3]]),
                         doc_ids=torch.tensor([[0] * 5 + [1] * 4]))
    with torch.no_grad():
        out = model(packed, ctx).logits
        torch.testing.assert_close(out[:, :5], model(a).logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out[:, 5:], model(b).logits, rtol=1e-5, atol=1e-5)


def naive_attention(q, k, v, doc_ids, window):
    """Reference: a loop over (b, h, i) with explicit causal / window / document rules."""
    B, T, H, D = q.shape
    K = k.shape[2]
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            kv = h // (H // K)  # query head h reads kv head h // group
            for i in range(T):
                js = [j for j in range(i + 1)
                      if (window is None or i - j < window)
                      and (doc_ids is None or doc_ids[b, i] == doc_ids[b, j])]
                scores = torch.stack([q[b, i, h] @ k[b, j, kv] for j in js]) / math.sqrt(D)
                p = scores.softmax(0)
                out[b, i, h] = sum(p[n] * v[b, j, kv] for n, j in enumerate(js))
    return out


@pytest.mark.parametrize("window, docs", [(None, False), (3, False), (None, True), (4, True)])
def test_sdpa_backend_matches_naive_loop(window, docs):
    g = torch.Generator().manual_seed(0)
    B, T, H, K, D = 2, 7, 4, 2, 8
    q, k, v = (torch.randn(B, T, n, D, generator=g) for n in (H, K, K))
    doc_ids = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 2, 2, 2]]) if docs else None
    ctx = ForwardContext(doc_ids=doc_ids, sliding_window=window)
    got = SdpaBackend().attend(q, k, v, 0, ctx)
    torch.testing.assert_close(got, naive_attention(q, k, v, doc_ids, window), rtol=1e-5, atol=1e-5)


def test_attention_mask_is_none_for_plain_causal():
    assert attention_mask(5, None, None, torch.device("cpu")) is None


def test_gqa_equals_mha_with_repeated_kv(make_config, make_model):
    gqa_cfg = make_config(n_heads=4, n_kv_heads=2, qkv_bias=True)
    gqa = make_model(gqa_cfg)
    mha = make_model(gqa_cfg.model_copy(update={"n_kv_heads": 4}), seed=5)
    D, group = gqa_cfg.hdim, 2
    state = {}
    for name, t in gqa.state_dict().items():
        if ".k_proj." in name or ".v_proj." in name:
            # (K*D, ...) -> (K, D, ...) -> repeat each kv head for its group of query heads
            rest = t.shape[1:]
            t = t.view(2, D, *rest).repeat_interleave(group, dim=0).reshape(4 * D, *rest)
        state[name] = t
    mha.load_state_dict(state)
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(mha(ids).logits, gqa(ids).logits, rtol=1e-5, atol=1e-5)


def test_bf16_forward_tracks_fp32(make_config, make_model):
    model = make_model(make_config(sliding_window=4))
    ids = torch.randint(0, 97, (1, 8))
    ctx = ForwardContext(doc_ids=torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]]))
    with torch.no_grad():
        want = model(ids, ctx).logits
        got = model.to(torch.bfloat16)(ids, ctx).logits
    assert got.dtype == torch.bfloat16 and model.rope_cos.dtype == torch.float32
    assert (got.float() - want).abs().max() < 0.02 * want.abs().max()  # bf16: ~3 digits


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_forward_tracks_cpu_fp32(make_config, make_model):
    model = make_model(make_config(sliding_window=3))  # dense: bf16 could flip MoE top-k
    ids = torch.randint(0, 97, (2, 8))
    ctx = ForwardContext(doc_ids=torch.tensor([[0] * 4 + [1] * 4] * 2))
    with torch.no_grad():
        want = model(ids, ctx).logits
        cuda = model.to("cuda", torch.bfloat16)
        assert cuda.rope_cos.device.type == "cuda" and cuda.rope_cos.dtype == torch.float32
        got = cuda(ids.cuda(), ForwardContext(doc_ids=ctx.doc_ids.cuda())).logits
    assert (got.float().cpu() - want).abs().max() < 0.02 * want.abs().max()
