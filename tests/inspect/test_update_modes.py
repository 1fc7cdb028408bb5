"""The verdicts tell the bad update mode from the recommended ones.

Tiny runs (the trainer tests' 2-layer d=32 model, 80 AdamW steps, checkpoints at 40 and 80)
in fp32, and bf16-true written round-to-nearest, with stochastic rounding and with Kahan
compensation, at peak lr 1e-3 and 1e-4: only round-to-nearest loses its small updates, and
the single-checkpoint report, the two-checkpoint report and the training guard each say so
for it and for no other mode."""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from astrai.inspect import inspect_weights
from astrai.train.bf16_update import stochastic_round
from astrai.train.muon import next_step

MODES = ("fp32", "nearest", "stochastic", "kahan")
LRS = (1e-3, 1e-4)
STEPS = 80


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _train(root: Path, mode: str, lr: float) -> tuple[list[Path], list[str]]:
    from astrai.train import train
    from tests.train.conftest import make_config, make_data

    kw = {"precision": "fp32"} if mode == "fp32" else {"precision": "bf16-true",
                                                       "bf16_update": mode}
    cfg = make_config(root / f"{mode}-{lr:g}", max_lr=lr, max_steps=STEPS, warmup_steps=5,
                      ckpt_interval=STEPS // 2, guard_bf16=True, guard_every=STEPS // 2, **kw)
    handler = _Warnings()
    logging.getLogger().addHandler(handler)
    try:
        run = Path(train(cfg, data=make_data(n=32)).run_dir)
    finally:
        logging.getLogger().removeHandler(handler)
    ckpts = [run / "checkpoints" / f"step_{s}" for s in (STEPS // 2, STEPS)]
    guard = [m for m in handler.messages if "round-to-nearest" in m or "lock-in" in m]
    return ckpts, guard


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(mode, lr) -> (the two checkpoints, the guard's warnings); ~15 s for all eight."""
    root = tmp_path_factory.mktemp("modes")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {(m, lr): _train(root, m, lr) for lr in LRS for m in MODES}
    finally:
        torch.set_num_threads(n)


@pytest.mark.parametrize("lr", LRS)
@pytest.mark.parametrize("mode", MODES)
def test_single_checkpoint_flags_round_to_nearest_only(runs, mode, lr):
    ckpts, _ = runs[(mode, lr)]
    rep = inspect_weights([ckpts[-1]], muon_step=next_step)
    scan = rep.scans[0]
    if mode == "nearest":
        assert rep.verdict == "suspected" and rep.exit_code == 1
        text = " ".join(f.message for f in rep.findings)
        assert "round away" in text and "gains still exactly 1.0" in text
        # every norm gain is still its init 1.0: no update reached half an ulp
        assert all(g.exact_one == g.entries for g in scan.gains)
    else:
        assert rep.verdict == "healthy", [f.message for f in rep.findings]
        assert rep.exit_code == 0
    assert scan.update.mode == mode and not scan.update.assumed


@pytest.mark.parametrize("lr", LRS)
@pytest.mark.parametrize("mode", MODES)
def test_two_checkpoints_flag_round_to_nearest_only(runs, mode, lr):
    """Entries left unchanged between the checkpoints are set beside what an unbiased
    rounding leaves unchanged: stochastic rounding stays close to that expectation, Kahan
    (compared as w + compensation) and fp32 have next to nothing, round-to-nearest far more."""
    ckpts, _ = runs[(mode, lr)]
    rep = inspect_weights(ckpts, muon_step=next_step)
    st = rep.stuck
    stuck_findings = [f for f in rep.findings if f.checkpoint is None]
    if mode == "nearest":
        assert rep.verdict == "suspected" and stuck_findings
        assert "unbiased rounding" in stuck_findings[0].message
        assert st.stuck > 2 * st.expected
    else:
        assert not stuck_findings, stuck_findings[0].message
        assert rep.verdict == "healthy", [f.message for f in rep.findings]
    assert st.modelled
    if mode == "stochastic":
        assert st.expected > 50 and 0.5 * st.expected < st.stuck < 1.5 * st.expected
    if mode == "kahan":
        assert all(t.compared == "compensated" for t in st.tensors
                   if t.param.role != "scalar")


@pytest.mark.parametrize("lr", LRS)
@pytest.mark.parametrize("mode", MODES)
def test_guard_warns_for_round_to_nearest_only_and_names_the_peak_lr(runs, mode, lr):
    _, warnings = runs[(mode, lr)]
    if mode != "nearest":
        assert warnings == []
        return
    assert warnings and all("round-to-nearest" in w for w in warnings)
    assert f"peak lr {lr:g}" in warnings[0]
    # a learning rate is only advised above the schedule's peak, never a warmup step's
    for w in warnings:
        for need in re.findall(r"at least ([0-9.e+-]+)", w):
            assert float(need) > lr


def test_lr_advice_only_above_the_peak():
    """Weights 2^-10 (half an ulp: 2^-18) whose AdamW update is 0.1 x lr move at
    lr >= 2^-18 / 0.1 = 3.8e-5. In warmup (lr 5e-6) of a 1e-4 peak no lr is advised: the
    peak already moves them. With a 1e-5 peak the advice names 3.8e-5 and the peak."""
    from astrai.inspect.guard import _fix

    p = torch.nn.Parameter(torch.full((64,), 2.0 ** -10, dtype=torch.bfloat16))
    # saved after step 1; step 2's bias corrections: m / 0.19 = 0.1, v / 0.001999 = 1
    state = {"step": torch.tensor(1.0), "exp_avg": torch.full((64,), 0.019),
             "exp_avg_sq": torch.full((64,), 1 - 0.999 ** 2)}
    group = {"name": "g", "params": [p], "betas": (0.9, 0.999), "eps": 1e-12,
             "weight_decay": 0.0, "lr": 5e-6, "initial_lr": 1e-4}
    opt = SimpleNamespace(param_groups=[group], state={p: state})
    assert "at least" not in _fix(opt, "g", 1e-4)
    msg = _fix(opt, "g", 1e-5)
    assert "peaks at 1e-05" in msg
    need = float(re.search(r"at least ([0-9.e+-]+)", msg).group(1))
    assert need == pytest.approx(2.0 ** -18 / 0.1, rel=0.02)


def test_unchanged_probability_is_the_skellam_mass_at_zero():
    """P(N_up = N_down) for Poisson counts, against the naive sum over k."""
    from astrai.inspect.unchanged import unchanged_probability

    up = torch.tensor([0.0, 0.3, 2.0, 5.0, 1.5])
    down = torch.tensor([0.0, 0.0, 0.5, 5.0, 3.0])
    got = unchanged_probability(up, down)
    for a, b, g in zip(up.tolist(), down.tolist(), got.tolist()):
        naive = sum(math.exp(-a) * a**k / math.factorial(k) * math.exp(-b) * b**k
                    / math.factorial(k) for k in range(80))
        assert g == pytest.approx(naive, rel=1e-9, abs=1e-12)
    assert unchanged_probability(torch.tensor([3.0]), torch.tensor([0.0])).item() == \
        pytest.approx(math.exp(-3.0))


def test_stochastic_rounding_stays_within_the_model_and_nearest_does_not():
    """4,096 bf16 weights in [0.5, 1) (ulp 2^-8), each stepped 10 times by a constant
    update r x ulp, r in (0, 0.5): stochastic rounding (the trainer's own) leaves about
    the model's count unchanged, round-to-nearest leaves them all."""
    from astrai.inspect.unchanged import unchanged_probability

    g = torch.Generator().manual_seed(0)
    n, steps = 4096, 10
    w0 = (0.5 + torch.rand(n, generator=g) * 0.5).bfloat16()
    ulp = 2.0 ** -8
    r = torch.rand(n, generator=g) * 0.5
    u = r * ulp
    p = unchanged_probability(u * steps / ulp, torch.zeros(n))
    expected, sd = float(p.sum()), float((p * (1 - p)).sum()) ** 0.5
    sr, rn = w0.clone(), w0.clone()
    for _ in range(steps):
        sr = stochastic_round(sr.float() + u, g)
        rn = (rn.float() + u).bfloat16()
    sr_same = int((sr == w0).sum())
    # (1 - r)^n <= exp(-n r): the model bounds the chance of never moving from above
    assert 0.8 * expected - 4 * sd < sr_same <= expected + 4 * sd
    assert int((rn == w0).sum()) == n > 1.5 * expected + 4 * sd


def test_cli_report_names_the_mode_explains_the_terms_and_exits_by_verdict(runs):
    import json

    from typer.testing import CliRunner

    from astrai_cli.main import app

    runner = CliRunner()
    nearest, stochastic = runs[("nearest", 1e-3)][0], runs[("stochastic", 1e-3)][0]
    res = runner.invoke(app, ["inspect-weights", str(nearest[-1])])
    assert res.exit_code == 1, res.output
    out = " ".join(res.output.split())  # rich may wrap
    assert "Weights: bf16 written round-to-nearest" in out
    for term in ("ulp (unit in the last place):", "binade:", "dead zone:", "alarming:"):
        assert term in out
    assert "≥ 25% of next updates under half an ulp" in out
    res = runner.invoke(app, ["inspect-weights", *map(str, stochastic)])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "stochastic rounding moves them on average (unbiased): not lost" in out
    assert "an unbiased rounding would leave about" in out
    res = runner.invoke(app, ["inspect-weights", "--json", *map(str, nearest)])
    data = json.loads(res.output)
    assert data["checkpoints"][0]["update_mode"]["mode"] == "nearest"
    assert data["stuck"]["modelled"] and data["stuck"]["expected"] > 0
    assert data["verdict"] == "suspected"


def test_mode_from_meta_or_assumed_and_frozen_base_gains_are_not_flagged(tmp_path):
    """A bf16 checkpoint at step 10 whose norm gains are all still 1.0: suspect when it was
    written round-to-nearest (meta.json) or has no record (assumed, and said so); not with
    stochastic rounding; not when its optimizer state shows the gains were never trained
    (a LoRA-style run whose base is frozen)."""
    from astrai.inspect.testing import fresh_state, tiny_config, write_checkpoint

    cfg = tiny_config()
    state = fresh_state(cfg, seed=0, dtype=torch.bfloat16)

    def verdict(name, meta, optimizer=None):
        path = write_checkpoint(tmp_path / name, state, cfg, meta={"step": 10, **meta})
        if optimizer is not None:
            torch.save(optimizer, path / "optimizer.pt")
        rep = inspect_weights([path])
        gains = [f for f in rep.findings if "gains still exactly 1.0" in f.message]
        return rep.scans[0].update, gains

    prec = lambda upd: {"train_config": {"precision": {"mode": "bf16-true",
                                                        "bf16_update": upd}}}
    mode, gains = verdict("nearest", prec("nearest"))
    assert (mode.mode, mode.assumed) == ("nearest", False) and len(gains) == 3
    mode, gains = verdict("auto", prec("auto"))
    assert mode.mode == "stochastic" and gains == []
    mode, gains = verdict("none", {})
    assert mode.assumed and gains and "assumed" in gains[0].message
    head = state["lm_head.weight"]
    trained_head_only = {
        "param_names": ["lm_head.weight"],
        "param_groups": [{"params": [0], "lr": 0.1, "betas": (0.9, 0.999), "eps": 1e-8,
                          "weight_decay": 0.0}],
        "state": {0: {"step": torch.tensor(10.0), "exp_avg": torch.ones(head.shape),
                      "exp_avg_sq": torch.ones(head.shape)}},
    }
    mode, gains = verdict("lora", prec("nearest"), trained_head_only)
    assert mode.mode == "nearest" and gains == []
