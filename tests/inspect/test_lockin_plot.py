"""`inspect-weights --plot`: the picture of a planted lock-in marks exactly the planted
layers and matrices (checked on the data handed to matplotlib, not on pixels)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from typer.testing import CliRunner

from astrai.inspect import inspect_weights
from astrai.inspect.bf16 import dead_zone_threshold
from astrai.viz.lockin import lockin_grid, value_histogram
from astrai_cli.main import app


@pytest.fixture(scope="module")
def planted_scan(planted_dir):
    return inspect_weights([planted_dir]).scans[0]


def test_grid_holds_the_planted_fractions(planted_scan, planted, cfg):
    g = lockin_grid(planted_scan)
    assert g.layers == list(range(cfg.n_layers))
    assert g.kinds == ["attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj",
                       "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    frac = np.array(g.fraction)
    k, down = g.kinds.index("attn.k_proj"), g.kinds.index("mlp.down_proj")
    k_numel = cfg.n_kv_heads * cfg.head_dim * cfg.dim
    rows = planted.k_rows[1] - planted.k_rows[0] + 1
    want = np.zeros_like(frac)
    for i in planted.k_layers:
        want[i, k] = rows * cfg.dim / k_numel
    want[:, down] = (planted.down_cols[1] - planted.down_cols[0] + 1) / (cfg.dim * cfg.ffn_dim)
    np.testing.assert_allclose(frac, want, rtol=0, atol=0)
    assert dict(g.outside)["lm_head"] == pytest.approx(1 / cfg.vocab_size)  # one whole row


def test_histogram_marks_locked_values_and_dead_zone(planted_scan, planted):
    h = value_histogram(planted_scan)
    assert dict(h.locked).keys() >= {1.0, planted.down_value, planted.head_value}
    assert h.dead_zone == dead_zone_threshold(7.5e-6) and h.lr == 7.5e-6
    assert len(h.edges) == len(h.counts) + 1 and h.counts[0] > 0 and h.counts[-1] > 0
    rows = planted.embed_rows[1] - planted.embed_rows[0] + 1
    assert h.beyond == rows * planted.embed_cols  # the overflowed 2e37 entries: counted only
    assert h.edges[-1] <= 2.0**14


def test_figure_marks_the_planted_cells(planted_scan, planted):
    pytest.importorskip("matplotlib")
    from astrai.viz.lockin import lockin_figure

    fig = lockin_figure([planted_scan])
    (heat,) = [a for a in fig.axes if a.get_title().startswith("locked fraction")]
    (hist,) = [a for a in fig.axes if a.get_title().startswith("values of the matrices")]
    (im,) = [i for i in heat.images if i.get_gid() == "locked_fraction"]
    g = lockin_grid(planted_scan)
    np.testing.assert_array_equal(np.ma.filled(im.get_array(), np.nan), np.array(g.fraction))
    k, down = g.kinds.index("attn.k_proj"), g.kinds.index("mlp.down_proj")
    marked = {tuple(map(int, t.get_gid().split("|")[1:])) for t in heat.texts
              if (t.get_gid() or "").startswith("cell|")}
    assert len(marked) == len(heat.texts)
    assert marked == {(i, k) for i in planted.k_layers} | {(i, down) for i in g.layers}
    labels = [t.get_text() for t in heat.get_yticklabels()]
    assert [labels[i] for i, _ in sorted(marked) if _ == k] == \
        [f"layer {i}" for i in planted.k_layers]
    gids = {a.get_gid() for a in hist.get_children()}
    assert {"dead_zone", "locked|1.0", f"locked|{planted.down_value!r}"} <= gids
    (x,) = {float(ln.get_xdata()[0]) for ln in hist.get_lines() if ln.get_gid() == "locked|1.0"}
    assert x == 1.0


def test_healthy_checkpoint_marks_nothing(healthy_dir):
    pytest.importorskip("matplotlib")
    from astrai.viz.lockin import lockin_figure

    scan = inspect_weights([healthy_dir]).scans[0]
    assert not np.array(lockin_grid(scan).fraction).any()
    texts = lockin_figure([scan]).axes[0].texts
    assert [t.get_text() for t in texts] == ["no locked weights"]


def test_cli_writes_the_picture_beside_the_report(planted_dir, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "lockin.png"
    r = CliRunner().invoke(app, ["inspect-weights", str(planted_dir), "--plot", str(out)])
    assert r.exit_code == 1, r.output  # findings
    assert "Verdict" in r.stdout and str(out) not in r.stdout  # the report alone on stdout
    assert r.stderr.strip().endswith(f"wrote {out}")  # on stderr, as `astrai plot` says it
    w, h = struct.unpack(">II", out.read_bytes()[16:24])
    assert (w, h) == (1200, 450)
    r = CliRunner().invoke(app, ["inspect-weights", str(planted_dir), "--plot",
                                 str(tmp_path / "x.pdf")])
    assert r.exit_code == 2 and "--plot" in r.output and not (tmp_path / "x.pdf").exists()


def test_cli_without_matplotlib_fails_before_the_scan(planted_dir, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    out = tmp_path / "lockin.png"
    r = CliRunner().invoke(app, ["inspect-weights", str(planted_dir), "--plot", str(out)])
    assert r.exit_code == 2 and "pip install 'astrai[plot]'" in r.output
    assert "Verdict" not in r.output and not out.exists()
