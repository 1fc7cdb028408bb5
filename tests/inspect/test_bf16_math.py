"""BF16 ULP, dead zone and clipping arithmetic against BF16 itself and the paper's figures."""

from __future__ import annotations

import math

import pytest
import torch

from astrai.inspect.bf16 import (
    clipped_spike,
    dead_zone_count,
    dead_zone_mask,
    dead_zone_min_binade,
    dead_zone_threshold,
    exponent_histogram,
    ulp,
    update_to_ulp_ratio,
)


def _next_up(w: torch.Tensor) -> torch.Tensor:
    """The next representable bf16 above positive w (bit pattern + 1)."""
    return (w.view(torch.int16) + 1).view(torch.bfloat16)


def test_ulp_at_one_is_two_to_minus_seven():
    assert ulp(1.0) == 2.0**-7 == 0.0078125
    assert ulp(1.99) == 2.0**-7
    assert ulp(2.0) == 2.0**-6
    assert ulp(0.06) == 2.0**-12  # 0.06 in [2^-5, 2^-4)
    assert ulp(-1.0) == ulp(1.0)
    assert ulp(1.0, torch.float32) == 2.0**-23
    assert ulp(1.0, torch.float16) == 2.0**-10


def test_ulp_matches_bf16_spacing_at_every_magnitude():
    g = torch.Generator().manual_seed(0)
    mags = torch.exp2(torch.empty(4000).uniform_(-60, 60, generator=g))
    w = mags.to(torch.bfloat16)
    spacing = (_next_up(w).double() - w.double())
    torch.testing.assert_close(ulp(w), spacing, rtol=0, atol=0)
    # subnormal range: the fixed step 2^-133
    tiny = torch.tensor([2.0**-130], dtype=torch.bfloat16)
    assert float(ulp(tiny)) == 2.0**-133 == float(_next_up(tiny).double() - tiny.double())
    assert float(ulp(torch.zeros(1))) == 2.0**-133
    assert math.isnan(float(ulp(torch.tensor([float("inf")]))))


def test_dead_zone_mask_matches_bf16_rounding():
    # An update of lr moves w (away from zero) iff lr >= ULP/2; exact ties are avoided by
    # using learning rates that are not powers of two.
    g = torch.Generator().manual_seed(1)
    mag = torch.exp2(torch.empty(20000).uniform_(-14, 2, generator=g))
    sign = torch.where(torch.rand(20000, generator=g) < 0.5, -1.0, 1.0)
    w = (sign * mag).to(torch.bfloat16)
    for lr in (7.5e-6, 3e-5, 1.1e-4, 6e-4, 3.3e-3):
        moved = (w.float() + torch.sign(w.float()) * lr).to(torch.bfloat16) != w
        dead = dead_zone_mask(w, lr)
        assert torch.equal(dead, ~moved), lr
        assert 0 < int(dead.sum()) < w.numel()  # both cases exercised


def test_dead_zone_threshold_closed_form():
    # lr < 2^(e-8)  <=>  dead for |w| >= 2^e, e the smallest such binade
    assert dead_zone_threshold(7.5e-6) == 2.0**-9  # the paper's lr: |w| >= 0.00195 is stuck
    assert dead_zone_threshold(1e-3) == 0.5
    assert dead_zone_threshold(2.0**-10) == 2.0**-1  # tie (lr == ULP/2) is not dead
    for lr in (1e-7, 3e-6, 1e-4, 0.02):
        e = dead_zone_min_binade(lr)
        assert lr < 2.0 ** (e - 8) and not lr < 2.0 ** (e - 9)
    with pytest.raises(ValueError):
        dead_zone_threshold(0.0)


def test_paper_update_at_one_is_over_1000x_below_ulp():
    # §Stage 3: AdamW updates 1.2e-6 .. 3.5e-8 against the ULP 2^-7 at w = 1.0
    assert update_to_ulp_ratio(1.2e-6, 1.0) == pytest.approx(6510.4, rel=1e-4)
    assert update_to_ulp_ratio(3.5e-8, 1.0) > 1000
    assert bool(dead_zone_mask(torch.tensor([1.0]), 1.2e-6))


def test_exponent_histogram_gives_dead_zone_count_for_any_lr():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(50000, generator=g) * 0.02
    w[:10] = 0.0
    w[10] = float("nan")
    hist = exponent_histogram(w)
    assert int(hist.sum()) == 50000 - 11  # zeros and non-finite excluded
    for lr in (1e-6, 7.5e-6, 1e-4, 1e-3):
        fin = w[torch.isfinite(w)]
        assert dead_zone_count(hist, lr) == int(dead_zone_mask(fin, lr).sum())


def test_clipped_spike_reproduces_paper_arithmetic():
    c = clipped_spike(1e4, 1.2e9)
    assert c.total_norm == pytest.approx(math.sqrt(1e8 + 1.2e9), rel=1e-9)
    assert round(c.total_norm) == 36056
    assert c.spike_after == pytest.approx(0.277, abs=1e-3)  # "remains at 0.28"
    assert c.background_after == pytest.approx(1 / 36056, rel=1e-4)
    no_clip = clipped_spike(0.1, 10, background=0.01)
    assert no_clip.scale == 1.0 and no_clip.spike_after == 0.1
