"""Checkpoints with planted lock-in are reported exactly; healthy ones are healthy."""

from __future__ import annotations

import json
import math

import pytest
from safetensors.torch import save_file

from astrai.errors import CheckpointError, ConfigError
from astrai.inspect import InspectConfig, inspect_weights
from astrai.inspect.source import find_lr, open_source
from astrai.inspect.testing import fresh_state, write_checkpoint


def _expect_planted(report, planted, cfg, prefix=""):
    assert report.verdict == "found" and report.exit_code == 1
    scan = report.scans[0]
    n = planted.counts(cfg)
    by_kind = {p.kind: p for p in scan.patterns}
    k = by_kind[f"{prefix}k_proj"]
    assert (k.value, k.count) == (1.0, n["k_proj"])
    assert k.layers.ranges == [(1, 3)] and k.rows.ranges == [(6, 7)] and k.same_rows
    assert k.cols.ranges == [(0, cfg.dim - 1)]
    d = by_kind["mlp.down_proj"]
    assert (d.value, d.count) == (-0.5, n["down_proj"])
    assert d.layers.ranges == [(0, 3)] and d.rows.ranges == [(1, 1)]
    assert d.cols.ranges == [(40, 99)]
    h = by_kind["lm_head"]
    assert (h.value, h.count, h.rows.ranges) == (0.75, n["lm_head"], [(3, 3)])
    assert set(by_kind) == {f"{prefix}k_proj", "mlp.down_proj", "lm_head"}
    assert scan.locked == n["k_proj"] + n["down_proj"] + n["lm_head"]
    over = {g.kind: g for g in scan.overflow}
    emb = over["embed_tokens"]
    assert (emb.entries, emb.nonfinite, emb.rows.ranges) == (n["embed"], 0, [(0, 3)])
    assert emb.absmax == pytest.approx(2e37, rel=1e-6)
    up = over["mlp.up_proj"]
    assert (up.entries, up.nonfinite, up.layers.ranges) == (n["nan"], n["nan"], [(2, 2)])
    assert up.rows.ranges == [(5, 5), (90, 90)]
    assert scan.nonfinite == n["nan"] and scan.overflowed == n["embed"]
    assert scan.gain_patterns == []  # norm gains at exactly 1.0 are not lock-in
    assert len(report.findings) == 5 and all(f.level == "found" for f in report.findings)


def test_planted_astrai_checkpoint_reported_exactly(planted_dir, planted, cfg):
    report = inspect_weights([planted_dir])
    _expect_planted(report, planted, cfg, prefix="attn.")
    scan = report.scans[0]
    assert scan.format == "astrai" and scan.step == 100
    assert (scan.lr, scan.lr_source) == (7.5e-6, "meta.json:lr")
    assert "k_proj: 384 entries at exactly 1.0, rows 6–7" in report.findings[0].message
    assert "in layers 1–3" in report.findings[0].message


def test_planted_hf_dir_reported_exactly(planted_hf_dir, planted, cfg):
    report = inspect_weights([planted_hf_dir])
    _expect_planted(report, planted, cfg, prefix="self_attn.")
    assert report.scans[0].format == "hf" and report.scans[0].lr is None


@pytest.mark.parametrize("fixture", ["healthy_dir", "healthy_bf16_dir"])
def test_random_init_is_healthy(fixture, request, cfg):
    report = inspect_weights([request.getfixturevalue(fixture)])
    assert report.verdict == "healthy" and report.exit_code == 0 and report.findings == []
    scan = report.scans[0]
    gains = {g.kind: g for g in scan.gains}
    # every norm gain sits at exactly 1.0, summarised but not a finding
    assert gains["attn_norm"].exact_one == cfg.n_layers * cfg.dim
    assert gains["norm"].exact_one == cfg.dim


def test_per_tensor_statistics_in_json(planted_dir):
    report = inspect_weights([planted_dir], InspectConfig(lr=1e-4))
    d = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    ck = d["checkpoints"][0]
    assert (ck["lr"], ck["lr_source"]) == (1e-4, "--lr")
    t = {x["name"]: x for x in ck["tensors"]}
    k1 = t["layers.1.attn.k_proj.weight"]
    assert k1["shape"] == [32, 64] and k1["dtype"] == "float32"
    assert k1["locked"][0]["rows"] == [[6, 7]] and k1["locked"][0]["count"] == 128
    assert {"mean", "std", "min", "max", "absmax", "nonfinite"} <= set(k1)
    assert t["layers.2.mlp.up_proj.weight"]["nonfinite"] == 3
    assert 0 < k1["dead_zone_fraction"] < 1
    assert d["verdict"] == "found" and d["label"] == "lock-in found"
    assert d["thresholds"]["overflow"] == 1e4


def test_dead_zone_figure_matches_formula(healthy_dir):
    from astrai.inspect.bf16 import dead_zone_mask
    from astrai.model.checkpoint import read_safetensors

    report = inspect_weights([healthy_dir])
    scan = report.scans[0]
    assert (scan.lr, scan.lr_source) == (3e-4, "meta.json:train.optimizer.lr")
    state = read_safetensors([healthy_dir / "model.safetensors"])
    z = scan.dead_zone[0]
    assert z.lr == 3e-4
    assert z.entries == sum(int(dead_zone_mask(v, 3e-4).sum()) for v in state.values())
    assert z.total == sum(v.numel() for v in state.values())
    assert [x.lr for x in scan.dead_zone[1:]] == [1e-3, 1e-4, 1e-5, 1e-6]
    fracs = [x.fraction for x in scan.dead_zone[1:]]
    assert fracs == sorted(fracs)  # smaller lr, more weights in the dead zone
    assert fracs[-1] > 0.9  # "at small learning rates most weights sit in it"


def test_single_file_and_extreme_rows(tmp_path, cfg):
    state = fresh_state(cfg, seed=3)
    state["embed_tokens.weight"][17] *= 300  # extreme norm, nothing over 1e4
    f = tmp_path / "w.safetensors"
    save_file(state, str(f))
    report = inspect_weights([f])
    assert report.verdict == "suspected" and report.exit_code == 1
    assert report.scans[0].format == "safetensors"
    assert "tokens 17" in report.findings[0].message


@pytest.mark.parametrize("make, message", [
    (lambda p: p, "no such file"),
    (lambda p: (p.mkdir(), p)[1], "no .safetensors weights"),
    (lambda p: (p.mkdir(), (p / "pytorch_model.bin").write_bytes(b"x"), p)[2], "convert it"),
    (lambda p: (p.mkdir(), (p / "model.safetensors").write_bytes(b"junk"), p)[2],
     "not a readable safetensors"),
    (lambda p: (p.with_suffix(".txt").write_text("x"), p.with_suffix(".txt"))[1],
     "not a .safetensors file"),
])
def test_bad_input_is_one_clear_error(tmp_path, make, message):
    path = make(tmp_path / "bad")
    with pytest.raises(CheckpointError, match=message):
        inspect_weights([path])


def test_bad_meta_and_threshold_are_errors(tmp_path, cfg):
    ck = write_checkpoint(tmp_path / "ck", fresh_state(cfg), cfg)
    (ck / "meta.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="meta.json: line 1"):
        open_source(ck)
    with pytest.raises(ConfigError, match="overflow"):
        InspectConfig.build(overflow=-1.0)


def test_find_lr_precedence():
    assert find_lr({"lr": 1e-3, "train": {"lr": 5e-4}}) == (1e-3, "lr")
    assert find_lr({"train": {"optim": {"max_lr": 2e-4}}}) == (2e-4, "train.optim.max_lr")
    assert find_lr({"lr": True, "step": 3}) == (None, None)


def test_chunked_reading_matches_whole(planted_dir):
    small = inspect_weights([planted_dir], InspectConfig(chunk_elements=1024))
    big = inspect_weights([planted_dir])
    a, b = small.scans[0], big.scans[0]
    assert [p.describe() for p in a.patterns] == [p.describe() for p in b.patterns]
    for x, y in zip(a.tensors, b.tensors):
        assert x.nonfinite == y.nonfinite and x.min == y.min and x.max == y.max
        assert math.isclose(x.std, y.std, rel_tol=1e-6)
