"""/metrics with speculative decoding: vLLM's spec_decode counters, read from EngineStats."""

from __future__ import annotations

import torch

from astrai.infer import CacheConfig, Engine, SamplingParams
from astrai.infer.config import SpeculativeConfig
from astrai.model import build_model, get_preset
from astrai.serve.metrics import ServerMetrics


def samples(text):
    return {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def test_spec_decode_counters():
    torch.manual_seed(0)
    cfg = get_preset("tiny", vocab_size=64, dim=32, n_layers=1, n_heads=2, n_kv_heads=1,
                     head_dim=16, ffn_dim=64, max_seq_len=128, init_std=0.2)
    model = build_model(cfg, seed=0).eval()
    plain = Engine(model, None, CacheConfig(page_size=4, max_kv_tokens=512, max_requests=4))
    assert "spec_decode" not in ServerMetrics("m").render(plain.stats(), 0)
    eng = Engine(model, None, CacheConfig(page_size=4, max_kv_tokens=512, max_requests=4),
                 speculative=SpeculativeConfig(num_speculative_tokens=3))
    eng.generate([[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 5, 6, 5]], SamplingParams.greedy(16))
    st = eng.stats()
    m = samples(ServerMetrics("m").render(st, 0))
    assert m["vllm:spec_decode_num_draft_tokens_total"] == st.spec_draft_tokens > 0
    assert m["vllm:spec_decode_num_accepted_tokens_total"] == st.spec_accepted_tokens
    assert m["vllm:spec_decode_num_drafts_total"] == st.spec_drafts > 0


def test_the_decode_path_is_exported():
    cfg = get_preset("tiny", vocab_size=64, dim=32, n_layers=1, n_heads=2, n_kv_heads=1,
                     head_dim=16, ffn_dim=64, max_seq_len=128, init_std=0.2)
    eng = Engine(build_model(cfg, seed=0).eval(), None,
                 CacheConfig(page_size=4, max_kv_tokens=512, max_requests=4), decode="static")
    text = ServerMetrics("m").render(eng.stats(), 0)
    assert 'astrai:decode_path_info{model_name="m",path="static"} 1' in text
