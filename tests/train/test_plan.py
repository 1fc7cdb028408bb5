"""Total optimizer steps (the AstrAI internals guide) and the dry-run plan."""

import math

import pytest

from astrai.model.presets import get_preset
from astrai.train.plan import memory_estimate, total_steps, windows_per_epoch


@pytest.mark.parametrize("n,B,A,P,E", [(100, 8, 1, 1, 1), (100, 8, 4, 1, 3), (101, 4, 3, 2, 2),
                                       (7, 8, 1, 1, 1), (1000, 3, 5, 4, 2)])
def test_total_steps_formula(n, B, A, P, E):
    samples_per_replica = math.ceil(n / P)
    batches = math.ceil(samples_per_replica / B)
    assert total_steps(n, B, A, P, E) == (batches // A) * E
    assert windows_per_epoch(n, B, A, P) == batches // A


def test_max_steps_overrides_epochs():
    assert total_steps(100, 8, 1, 1, epochs=1, max_steps=500) == 500


def test_memory_estimate_counts_adamw_and_checkpointing():
    c = get_preset("tiny")
    m = memory_estimate(c, 8, 256)
    assert m["optimizer"] == 2 * m["weights"]
    assert m["total"] == sum(v for k, v in m.items() if k != "total")
    assert memory_estimate(c, 8, 256, gradient_checkpointing=True)["activations"] < m["activations"]


def test_bytes_per_param_by_precision_and_bf16_update():
    """weights + gradients + optimizer state: AdamW's two moments, Muon's one buffer, Kahan's
    bf16 compensation."""
    from astrai.train.plan import bytes_per_param

    assert bytes_per_param("fp32")["total"] == 16
    assert bytes_per_param("bf16-true", "stochastic")["total"] == 12
    assert bytes_per_param("bf16-true", "kahan") == {"weights": 2, "gradients": 2,
                                                     "optimizer": 10, "total": 14}
    assert bytes_per_param("bf16-true", "nearest", state_bytes=2)["total"] == 8
    assert bytes_per_param("bf16-true", "kahan", muon_share=1.0)["optimizer"] == 6
    c = get_preset("tiny")
    n = memory_estimate(c, 1, 8)["optimizer"]
    assert memory_estimate(c, 1, 8, kahan=True)["optimizer"] == n * 10 // 8
