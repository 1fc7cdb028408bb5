"""metrics.jsonl as series: step order, last record wins, cut lines skipped; the EMA and
the sparkline against closed forms."""

from __future__ import annotations

import json
import math

import pytest

from astrai.errors import ConfigError, DataError
from astrai.viz import ema, read_metrics, series, sparkline


def test_read_metrics_orders_dedupes_and_skips_cut_lines(tmp_path):
    lines = [json.dumps({"step": 2, "loss": 2.0}), json.dumps({"step": 1, "loss": 1.0}),
             json.dumps({"step": 2, "loss": 2.5}), '{"step": 3, "lo']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines))
    recs = read_metrics(tmp_path)
    assert [(r["step"], r["loss"]) for r in recs] == [(1, 1.0), (2, 2.5)]
    with pytest.raises(DataError, match="no metrics.jsonl"):
        read_metrics(tmp_path / "nope")


def test_series_axes_and_non_finite():
    recs = [{"step": 1, "loss": 3.0, "consumed_tokens": 64, "elapsed_s": 0.5},
            {"step": 2, "loss": "nan", "consumed_tokens": 128, "elapsed_s": 1.0},
            {"step": 3, "consumed_tokens": 192, "elapsed_s": 1.5}]
    s = series(recs, "loss", "tokens")
    assert s.x == [64.0, 128.0] and s.y[0] == 3.0 and math.isnan(s.y[1])
    assert series(recs, "loss", "time").x == [0.5, 1.0]
    with pytest.raises(ConfigError, match="--x"):
        series(recs, "loss", "epochs")


def test_ema_is_the_debiased_closed_form():
    vals, w = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0], 0.7
    want = []
    for t in range(len(vals)):
        num = sum(w ** (t - i) * (1 - w) * vals[i] for i in range(t + 1))
        want.append(num / (1 - w ** (t + 1)))
    assert ema(vals, w) == pytest.approx(want, rel=1e-12)
    assert ema([2.0] * 5, 0.9) == pytest.approx([2.0] * 5)  # debiased: no pull towards 0
    assert ema(vals, 0.0) == vals
    out = ema([1.0, math.inf, 3.0], 0.5)
    assert math.isinf(out[1]) and out[2] == pytest.approx((0.5 * 1 + 3) * 0.5 / 0.75)


def test_sparkline():
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7], width=8) == "▁▂▃▄▅▆▇█"
    assert sparkline([5.0, 5.0, 5.0]) == "▄▄▄"
    assert sparkline([1.0, math.nan, 2.0]) == "▁!█"
    assert len(sparkline(list(range(100)), width=24)) == 24
    assert sparkline(list(range(100)), width=4)[-1] == "█"
    assert sparkline([]) == ""
