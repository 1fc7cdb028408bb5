"""When each benchmark request is sent: all at once, Poisson, or gamma (bursty) arrivals.

vLLM's `--request-rate` / `--burstiness`: inter-arrival gaps are Gamma(shape=b,
scale=1 / (rate * b)), so the mean gap is 1 / rate whatever b is; b = 1 is a Poisson process
(exponential gaps), b < 1 is burstier (coefficient of variation 1 / sqrt(b) > 1), b > 1 is
more uniform. The first request is sent at t = 0.
"""

from __future__ import annotations

import math

import numpy as np

from astrai.errors import ConfigError


def parse_rate(value: str | float) -> float:
    """'inf' or a positive number of requests per second."""
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return math.inf
    try:
        rate = float(value)
    except ValueError:
        rate = -1.0
    if not rate > 0:
        raise ConfigError(f"--request-rate {value}: use 'inf' or a number of requests per "
                          "second > 0")
    return rate


def arrival_offsets(n: int, rate: float = math.inf, burstiness: float = 1.0,
                    seed: int = 0) -> list[float]:
    """Send times (seconds after the start) of n requests; non-decreasing, first is 0."""
    if not burstiness > 0 or not math.isfinite(burstiness):
        raise ConfigError(f"--burstiness {burstiness}: must be a finite number > 0 "
                          "(1 = Poisson)")
    if not rate > 0:
        raise ConfigError(f"--request-rate {rate}: must be > 0 (or inf)")
    if n <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return [0.0] + np.cumsum(gaps).tolist()
