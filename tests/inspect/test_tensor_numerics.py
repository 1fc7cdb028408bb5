"""One tensor: statistics against torch, locked values found exactly, heavy tails not."""

from __future__ import annotations

import math

import pytest
import torch

from astrai.inspect.config import InspectConfig
from astrai.inspect.names import parse_name
from astrai.inspect.tensor import analyze_tensor


def _analyze(t: torch.Tensor, name: str = "layers.1.attn.k_proj.weight", **cfg):
    rows = t.shape[0] if t.dim() else 1
    t2 = t.reshape(rows, -1)
    return analyze_tensor(lambda a, b: t2[a:b], parse_name(name, t.dim()), tuple(t.shape),
                          t.dtype, InspectConfig(**cfg))


def _gauss(shape, seed=0, std=0.02):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * std


@pytest.mark.parametrize("chunk", [1024, 1 << 23])
def test_statistics_match_torch(chunk):
    w = _gauss((300, 77), std=0.05) + 0.01
    w[3, 4] = float("nan")
    w[9, 9] = float("inf")
    w[10, 0] = 3e4
    st = _analyze(w, chunk_elements=chunk)
    fin = w[torch.isfinite(w)].double()
    assert st.nonfinite == 2 and st.overflow == 1
    assert st.mean == pytest.approx(float(fin.mean()), rel=1e-6)  # fp32 accumulation
    assert st.std == pytest.approx(float(fin.std(unbiased=False)), rel=1e-6)
    assert st.min == float(fin.min()) and st.max == 3e4 and st.absmax == 3e4
    assert st.bad_rows.ranges == [(3, 3), (9, 10)]
    assert st.top[0] == ((9, 9), math.inf)  # inf first, then the overflowed entry
    assert st.top[1] == ((10, 0), 3e4)
    assert st.locked == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("chunk", [4096, 1 << 23])
def test_planted_locked_rows_found_exactly(dtype, chunk):
    w = _gauss((256, 512), seed=1)
    w[6:8] = 1.0
    w[40, 100:300] = -0.25
    st = _analyze(w.to(dtype), chunk_elements=chunk)
    got = {lv.value: lv for lv in st.locked}
    assert set(got) == {1.0, -0.25}
    one, neg = got[1.0], got[-0.25]
    assert one.count == 1024 and one.rows.ranges == [(6, 7)] and one.cols.ranges == [(0, 511)]
    assert one.full_rows == 2 and one.z > 40
    assert neg.count == 200 and neg.rows.ranges == [(40, 40)]
    assert neg.cols.ranges == [(100, 299)] and neg.full_rows == 0
    assert st.exact_one == 1024


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_healthy_gaussian_has_no_locked_values(dtype):
    st = _analyze(_gauss((1024, 1024), seed=2).to(dtype))
    assert st.locked == [] and st.nonfinite == 0 and st.overflow == 0


def test_dense_bf16_heavy_tail_is_not_lock_in():
    # Student-t(2) weights in bf16: far-out values repeat by rounding alone, and their
    # neighbours are just as populated; the density check must keep them out.
    t = torch.distributions.StudentT(2.0)
    torch.manual_seed(3)
    w = (t.sample((2048, 1024)) * 0.01).to(torch.bfloat16)
    st = _analyze(w)
    assert st.locked == []
    # ...while a planted value in that same tail is still caught
    w2 = w.clone()
    w2[5, :64] = 0.40625  # exactly representable in bf16, ~40 robust std out
    st2 = _analyze(w2)
    assert [lv.value for lv in st2.locked] == [0.40625]
    assert st2.locked[0].count >= 64


def test_thresholds_are_respected():
    w = _gauss((128, 128), seed=4)
    w[0, :20] = 1.0
    assert [lv.count for lv in _analyze(w).locked] == [20]
    assert _analyze(w, lock_min_count=21).locked == []
    assert _analyze(w, lock_min_z=100.0).locked == []


def test_constant_and_dominated_tensors():
    st = _analyze(torch.zeros(64, 64))
    assert st.locked == [] and st.dominant is None and st.zeros == 4096
    w = torch.full((64, 64), 0.5)
    w[:5] = _gauss((5, 64))
    st = _analyze(w)
    assert st.dominant == 0.5


def test_embedding_extreme_rows_by_token():
    w = _gauss((200, 64), seed=5)
    w[7] *= 400  # row norm 400x the others, no entry above the overflow threshold
    w[9, :3] = 2e37
    st = _analyze(w, name="embed_tokens.weight")
    rows = [r for r, _ in st.extreme_rows]
    assert rows == [7, 9]
    assert st.bad_rows.ranges == [(9, 9)] and st.overflow == 3
    assert st.row_norm_median == pytest.approx(0.02 * 8, rel=0.2)
