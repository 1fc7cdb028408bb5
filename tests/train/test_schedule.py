"""Schedules against their closed forms, and the scheduler driving an optimizer."""

import math

import pytest
import torch

from astrai.errors import ConfigError
from astrai.train.schedule import SCHEDULERS, cosine_rate, sgdr_rate, wsd_rate


def cos_closed(s, W, N, m):
    if s < W:
        return (s + 1) / W
    return m + (1 - m) * (1 + math.cos(math.pi * (s - W) / (N - W))) / 2


@pytest.mark.parametrize("W,N,m", [(0, 100, 0.1), (10, 100, 0.0), (5, 37, 0.25)])
def test_cosine_closed_form(W, N, m):
    for s in range(N):
        assert cosine_rate(s, warmup=W, total=N, min_rate=m) == pytest.approx(cos_closed(s, W, N, m))
    # warmup is linear and never zero; the peak is reached at the end of warmup
    if W:
        assert cosine_rate(0, warmup=W, total=N, min_rate=m) == pytest.approx(1 / W)
        assert cosine_rate(W - 1, warmup=W, total=N, min_rate=m) == pytest.approx(1.0)
    assert cosine_rate(W, warmup=W, total=N, min_rate=m) == pytest.approx(1.0)
    assert cosine_rate(N, warmup=W, total=N, min_rate=m) == pytest.approx(m)  # past the end


def test_sgdr_restarts_double():
    W, C, m = 4, 10, 0.0
    # Cycles after warmup: [4,14), [14,34), [34,74): lengths 10, 20, 40, each restarting at 1.
    for start, length in [(4, 10), (14, 20), (34, 40)]:
        assert sgdr_rate(start, warmup=W, cycle=C, min_rate=m) == pytest.approx(1.0)
        for t in range(length):
            want = m + (1 - m) * (1 + math.cos(math.pi * t / length)) / 2
            assert sgdr_rate(start + t, warmup=W, cycle=C, min_rate=m) == pytest.approx(want)
    assert sgdr_rate(13, warmup=W, cycle=C, min_rate=m) < 0.03  # end of the first cycle


def test_wsd_quadratic_decay():
    W, N, D, m = 10, 100, 20, 0.1
    for s in range(N):
        if s < W:
            want = (s + 1) / W
        elif s < N - D:
            want = 1.0
        else:
            want = m + (1 - m) * (1 - (s - (N - D)) / D) ** 2
        assert wsd_rate(s, warmup=W, total=N, decay=D, min_rate=m) == pytest.approx(want)


def _opt(lr=1.0):
    p = torch.nn.Parameter(torch.zeros(2))
    return torch.optim.SGD([p], lr=lr)


@pytest.mark.parametrize("kind", ["cosine", "sgdr", "wsd"])
def test_scheduler_sets_lr_and_resumes(kind):
    opt = _opt(0.5)
    kw = {"total_steps": 50, "warmup_steps": 5, "min_rate": 0.1}
    sched = SCHEDULERS.get(kind)(opt, **kw)
    lrs = []
    for _ in range(30):
        lrs.append(opt.param_groups[0]["lr"])
        sched.step()
    assert lrs[0] == pytest.approx(0.5 / 5)
    state = sched.state_dict()
    opt2 = _opt(0.5)
    sched2 = SCHEDULERS.get(kind)(opt2, **kw)
    sched2.load_state_dict(state)
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_unknown_schedule():
    with pytest.raises(ConfigError, match="unknown 'linear'"):
        SCHEDULERS.get("linear")


@pytest.mark.parametrize("kind", ["cosine", "sgdr", "wsd"])
def test_schedulers_reject_unknown_options(kind):
    # cosine takes no decay_ratio; a misspelt key never passes silently
    with pytest.raises(ConfigError, match=rf"schedule '{kind}': unknown option\(s\) decay_ration"):
        SCHEDULERS.get(kind)(_opt(), total_steps=1, warmup_steps=0, min_rate=0,
                             decay_ration=0.1)
