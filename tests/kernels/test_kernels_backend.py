"""CudaBackend's wiring, checked on the CPU (where its ops run the references) against
TorchNativeBackend, and its fall-through reasons."""

from __future__ import annotations

import pytest
import torch

from astrai.infer.backends import TorchNativeBackend, backend_status
from astrai.infer.backends.cuda import CudaBackend
from astrai.infer.cache import build_kv_cache
from astrai.model.context import ForwardContext


def make_step(prefix_lens, qo_lens, H=4, K=2, D=16, L=2, seed=0, dtype=torch.float32):
    """A 2-layer pool with scattered slots holding random prefix K/V, and new q/k/v."""
    g = torch.Generator().manual_seed(seed)
    seq = [p + q for p, q in zip(prefix_lens, qo_lens)]
    C = max(seq) + 2
    S = sum(seq) + 9
    perm = torch.randperm(S, generator=g)
    kb = torch.randn(L, S, K, D, generator=g).to(dtype)
    vb = torch.randn(L, S, K, D, generator=g).to(dtype)
    table = torch.zeros(len(seq) + 1, C, dtype=torch.int32)
    rows = [len(seq) - b for b in range(len(seq))]
    used = 0
    for b, s in enumerate(seq):
        table[rows[b], :s] = perm[used:used + s].to(torch.int32)
        used += s
    rec = build_kv_cache(kb, vb, table, rows, prefix_lens, qo_lens, 1)
    N = sum(qo_lens)
    q, k, v = (torch.randn(1, N, n, D, generator=g).to(dtype) for n in (H, K, K))
    return rec, q, k, v


def run(backend, rec, q, k, v, layer=1):
    rec = build_kv_cache(rec.k_buf.clone(), rec.v_buf.clone(), rec.req_to_token,
                         rec.req_pool_indices.tolist(), rec.prefix_lens_cpu, rec.qo_lens_cpu, 1)
    ctx = ForwardContext(positions=rec.positions[None], cache=rec, backend=backend)
    return backend.attend(q, k, v, layer, ctx), rec


@pytest.mark.parametrize(("prefix", "qo"), [
    ([0, 0], [5, 3]),          # fresh prompts
    ([4, 0, 9], [3, 2, 1]),    # chunked prefill with cached prefixes, mixed with a decode
    ([6, 1, 12], [1, 1, 1]),   # pure decode step
])
def test_cuda_backend_matches_torch_native(prefix, qo):
    rec, q, k, v = make_step(prefix, qo, seed=len(prefix) + sum(qo))
    ours, rec_ours = run(CudaBackend(), rec, q, k, v)
    theirs, rec_theirs = run(TorchNativeBackend(), rec, q, k, v)
    assert ours.shape == q.shape
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    # k/v landed in the same slots of the same layer
    assert torch.equal(rec_ours.k_buf, rec_theirs.k_buf)
    assert torch.equal(rec_ours.v_buf, rec_theirs.v_buf)


def test_cuda_backend_names_why_it_cannot_serve():
    b = CudaBackend()
    rec, q, _, _ = make_step([0], [3])
    ctx = ForwardContext(cache=rec)
    assert "cpu" in b.supports(q, ctx)
    assert "training" in b.supports(q, ForwardContext())
    if not torch.cuda.is_available():
        assert CudaBackend.unavailable_reason() == "no CUDA device"
        assert backend_status()["cuda"] == "no CUDA device"


@pytest.mark.slow
def test_engine_with_cuda_backend_generates_like_torch_native():
    # The whole model through the engine (paged pool, chunked prefill, decode steps): on the
    # CPU the cuda backend's ops are the references, so this checks the backend's wiring.
    from astrai.infer.config import CacheConfig
    from astrai.infer.engine import Engine
    from astrai.infer.params import SamplingParams
    from astrai.model import build_model, get_preset

    model = build_model(get_preset("tiny"), seed=0)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 8192, (n,), generator=g).tolist() for n in (5, 40, 12)]
    params = SamplingParams(max_tokens=4, temperature=0.0, logprobs=True, ignore_eos=True)
    outs = {}
    for backend in (CudaBackend(), TorchNativeBackend()):
        eng = Engine(model, None, CacheConfig(max_kv_tokens=1024, max_requests=4), backend)
        outs[backend.name] = eng.generate(prompts, params)
    for a, b in zip(outs["cuda"], outs["torch_native"]):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs),
                                   atol=1e-4, rtol=0)
