"""Checkpoints of one run: entries bit-identical across them while their tensor moved."""

from __future__ import annotations

import pytest
import torch

from astrai.errors import CheckpointError
from astrai.inspect import InspectConfig, inspect_weights
from astrai.inspect.testing import fresh_state, tiny_config, write_checkpoint


def _moved(state, delta, frozen):
    """Every entry moved by `delta`, except the (name, index) subsets in `frozen`."""
    out = {}
    for k, v in state.items():
        new = v + delta
        for name, idx in frozen:
            if name == k:
                new[idx] = v[idx]
        out[k] = new
    return out


FROZEN = [
    ("layers.1.mlp.down_proj.weight", (slice(2, 4), slice(None))),  # rows 2-3: 2 x 128
    ("layers.2.attn.q_proj.weight", (slice(None), slice(10, 20))),  # cols 10-19: 64 x 10
    ("lm_head.weight", (slice(5, 6), slice(0, 7))),  # 7 entries of token 5
    ("embed_tokens.weight", (slice(100, 300), slice(None))),  # unseen tokens: not counted
]


@pytest.mark.parametrize("dtype, delta", [(torch.float32, 1e-3), (torch.bfloat16, 2.0**-6)])
def test_two_checkpoints_report_exactly_the_frozen_subset(tmp_path, dtype, delta):
    cfg = tiny_config()
    a = fresh_state(cfg, seed=0, dtype=dtype)
    b = _moved(a, delta, FROZEN)
    b["layers.0.attn.v_proj.weight"] = a["layers.0.attn.v_proj.weight"].clone()  # frozen whole
    pa = write_checkpoint(tmp_path / "step_1", a, cfg)
    pb = write_checkpoint(tmp_path / "step_2", b, cfg)
    report = inspect_weights([pa, pb])
    st = report.stuck
    t = {x.name: x for x in st.tensors}
    down, q, head = (t["layers.1.mlp.down_proj.weight"], t["layers.2.attn.q_proj.weight"],
                     t["lm_head.weight"])
    assert (down.stuck, down.rows.ranges, down.full_rows) == (2 * 128, [(2, 3)], 2)
    assert (q.stuck, q.cols.ranges, q.rows.ranges) == (64 * 10, [(10, 19)], [(0, 63)])
    assert (head.stuck, head.rows.ranges, head.cols.ranges) == (7, [(5, 5)], [(0, 6)])
    assert all(x.status == "moving" and x.counted for x in (down, q, head))
    emb = t["embed_tokens.weight"]
    assert emb.stuck == 200 * 64 and emb.rows.ranges == [(100, 299)] and not emb.counted
    assert st.stuck == 256 + 640 + 7  # the total counts moving matrices only
    assert st.unchanged == ["layers.0.attn.v_proj.weight"]
    others = [x for x in st.tensors if x.name not in
              {n for n, _ in FROZEN} | {"layers.0.attn.v_proj.weight"}]
    assert all(x.stuck == 0 for x in others)
    assert report.verdict == "suspected" and report.exit_code == 1
    assert "903 entries of moving matrices" in report.findings[-1].message


def test_three_checkpoints_need_all_identical(tmp_path):
    cfg = tiny_config()
    a = fresh_state(cfg, seed=0)
    b = _moved(a, 1e-3, FROZEN[:2])
    c = _moved(b, 1e-3, FROZEN[:1])  # only down_proj rows stay frozen through c
    paths = [write_checkpoint(tmp_path / f"s{i}", s, cfg) for i, s in enumerate((a, b, c))]
    st = inspect_weights(paths).stuck
    assert st.stuck == 256
    assert len(st.paths) == 3


def test_nothing_stuck_is_healthy_and_threshold_applies(tmp_path):
    cfg = tiny_config()
    a = fresh_state(cfg, seed=0)
    pa = write_checkpoint(tmp_path / "a", a, cfg)
    pb = write_checkpoint(tmp_path / "b", _moved(a, 1e-3, []), cfg)
    assert inspect_weights([pa, pb]).verdict == "healthy"
    pc = write_checkpoint(tmp_path / "c", _moved(a, 1e-3, FROZEN[2:3]), cfg)  # 7 stuck
    assert inspect_weights([pa, pc]).verdict == "healthy"  # 7 < stuck_min_count (16)
    assert inspect_weights([pa, pc], InspectConfig(stuck_min_count=7)).verdict == "suspected"
    assert inspect_weights([pa, pc], InspectConfig(stuck_min_count=8)).verdict == "healthy"


def test_mismatched_checkpoints(tmp_path):
    a_cfg, b_cfg = tiny_config(), tiny_config(n_layers=2, dim=32, vocab_size=100, head_dim=8)
    pa = write_checkpoint(tmp_path / "a", fresh_state(a_cfg), a_cfg)
    pb = write_checkpoint(tmp_path / "b", fresh_state(b_cfg), b_cfg)
    with pytest.raises(CheckpointError, match="no tensor in common"):
        inspect_weights([pa, pb])
    c_cfg = tiny_config(n_layers=5)
    pc = write_checkpoint(tmp_path / "c", fresh_state(c_cfg), c_cfg)
    st = inspect_weights([pa, pc]).stuck
    assert any(n.startswith("layers.4.") for n in st.mismatched)
