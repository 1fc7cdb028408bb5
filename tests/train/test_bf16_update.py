"""--bf16-update: how bf16-true weights take their fp32 update (astrai.train.bf16_update).

Stochastic rounding is unbiased and reproducible from its seed; Kahan compensation tracks
fp32 accumulation where round-to-nearest stays locked; both run under AdamW and Muon, resume
bit-identically, and are refused with precisions that keep fp32 weights."""

from __future__ import annotations

import math

import pytest
import torch

from astrai.errors import ConfigError
from astrai.train.adamw import AdamW
from astrai.train.bf16_update import (
    KAHAN_KEY,
    WeightWriter,
    rounding_seed,
    stochastic_round,
)
from astrai.train.muon import MuonAdamW
from astrai.train.precision import resolve_precision


def _ulp_below(x: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 values around |x| (x not a power of two): 2^(e - 7)."""
    return torch.exp2(torch.floor(torch.log2(x.abs())) - 7)


def test_stochastic_rounding_is_unbiased():
    """Mean of N roundings of x equals x within 5 standard errors: each rounding is one of
    x's two bf16 neighbours (distance ulp), so its standard deviation is <= ulp / 2 and the
    mean's is <= ulp / (2 sqrt(N)). Seeded, so the check is deterministic."""
    x = torch.tensor([1.0 + 0.3 * 2**-7, -1.0 - 0.9 * 2**-7, 3.3e-3, -7.77, 0.1234567, 1234.5])
    n = 20_000
    g = torch.Generator().manual_seed(0)
    r = stochastic_round(x.repeat(n, 1), g)  # (N, 6)
    assert r.dtype == torch.bfloat16
    lo, hi = x.bfloat16().float(), x.bfloat16().float()  # one of the neighbours...
    ulp = _ulp_below(x)
    lo = torch.minimum(lo, torch.where(lo > x, lo - ulp, lo))
    hi = torch.maximum(hi, torch.where(hi < x, hi + ulp, hi))
    rf = r.float()
    assert bool(((rf == lo) | (rf == hi)).all())  # only the two neighbours
    bound = 5 * ulp / (2 * math.sqrt(n))
    assert bool(((rf.double().mean(0) - x.double()).abs() <= bound).all())
    nearest = x.bfloat16().float()
    assert bool(((nearest - x).abs() > 10 * bound).any())  # rounding to nearest is biased


def test_stochastic_rounding_keeps_exact_values_and_specials():
    g = torch.Generator().manual_seed(0)
    x = torch.tensor([1.0, -2.0, 0.0, 0.0078125, float("inf"), -float("inf")]).repeat(100, 1)
    assert torch.equal(stochastic_round(x, g), x.bfloat16())  # representable: no noise
    assert stochastic_round(torch.tensor([float("nan")]), g).isnan().all()


def test_stochastic_rounding_is_reproducible_from_seed_and_state():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(1))
    a = stochastic_round(x, torch.Generator().manual_seed(7))
    assert torch.equal(a, stochastic_round(x, torch.Generator().manual_seed(7)))
    assert not torch.equal(a, stochastic_round(x, torch.Generator().manual_seed(8)))
    w = WeightWriter("stochastic", seed=7)
    first = stochastic_round(x, w.generator(x.device))
    saved = w.state_dict()
    second = stochastic_round(x, w.generator(x.device))
    again = WeightWriter("stochastic", seed=7)
    again.load_state_dict(saved)
    assert torch.equal(first, a) and not torch.equal(first, second)
    assert torch.equal(stochastic_round(x, again.generator(x.device)), second)


def _accumulate(mode: str, updates: torch.Tensor, w0: float = 1.0) -> tuple[torch.Tensor, dict]:
    """w <- w + u for each u, written to a bf16 weight by a WeightWriter in `mode`."""
    p = torch.full((256,), w0, dtype=torch.bfloat16)
    writer, state = WeightWriter(mode, seed=0), {}
    for u in updates.tolist():
        p32 = writer.read(p, state)
        writer.write(p, p32.add_(u), state)
    return p.float(), state


def test_kahan_tracks_fp32_accumulation_where_nearest_is_frozen():
    """10,000 updates of ~-3e-5 on w = 1 (each under half a bf16 ulp, 2^-9 below 1):
    nearest never moves; Kahan ends within 2 ulps (0.0078) of fp32 accumulation, which
    moves by ~0.3; stochastic rounding ends within 2 ulps on average. This is a scale where
    a bf16 compensation works: it freezes below ~2^-10 ulp(w) (2^-18 = 3.8e-6 going down
    from 1.0; docs/bf16-lockin.md "The limit of Kahan"), tested below."""
    updates = -3e-5 * (1 + 0.5 * torch.rand(10_000, generator=torch.Generator().manual_seed(0)))
    exact = 1.0 + updates.double().sum().item()
    assert abs(updates).max() < 2**-9
    nearest, _ = _accumulate("nearest", updates)
    kahan, state = _accumulate("kahan", updates)
    stochastic, _ = _accumulate("stochastic", updates)
    assert bool((nearest == 1.0).all())
    assert bool(((kahan - exact).abs() <= 2 * 2**-8).all()), (kahan[0].item(), exact)
    assert state[KAHAN_KEY].dtype == torch.bfloat16
    assert abs(stochastic.mean().item() - exact) <= 2 * 2**-8


def test_kahan_with_bf16_compensation_still_locks_the_papers_updates():
    """The documented limit (docs/bf16-lockin.md): weight + bf16 compensation hold ~16
    significand bits, so updates of 1e-6 at w = 1 (the paper's range) freeze the
    compensation too; stochastic rounding still moves the weight by the right amount."""
    updates = torch.full((10_000,), -1e-6)
    kahan, _ = _accumulate("kahan", updates)
    stochastic, _ = _accumulate("stochastic", updates)
    assert bool((kahan == 1.0).all())
    assert abs(stochastic.mean().item() - 0.99) < 2e-3


@pytest.mark.parametrize("u,moves", [(7.5e-6, False), (7.7e-6, True),   # up from 1.0
                                       (-3e-6, False), (-4e-6, True)])  # down from 1.0
def test_kahan_limit_is_about_2_to_the_minus_10_ulp(u, moves):
    """The documented limit: c freezes once u is under half its own spacing (~|c| 2^-8)
    before |c| reaches half the spacing of w, i.e. u below ~2^-10 ulp(w): 2^-17 = 7.6e-6
    going up from 1.0 (ulp 2^-7), 2^-18 = 3.8e-6 going down (spacing 2^-8 below 1.0)."""
    kahan, _ = _accumulate("kahan", torch.full((2_000,), u))
    assert bool((kahan != 1.0).all()) == moves and bool((kahan == 1.0).all()) != moves


def _train(opt_cls, mode: str, dtype: torch.dtype, steps: int = 300, **kw) -> torch.Tensor:
    torch.manual_seed(0)
    w0 = (torch.randn(32, 16) * 0.02 + 1.0).bfloat16().float()  # |w| ~ 1: ulp 2^-8 or 2^-7
    p = torch.nn.Parameter(w0.clone().to(dtype))
    opt = opt_cls([{"params": [p], **kw.pop("group", {})}], bf16_update=mode, **kw)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        p.grad = (1 + 0.3 * torch.randn(32, 16, generator=g)).to(dtype)  # a steady pull
        opt.step()
    return p.detach().float() - w0  # the weight's move


@pytest.mark.parametrize("opt_cls,kw", [
    (AdamW, {"lr": 5e-5, "weight_decay": 0.0}),
    (MuonAdamW, {"lr": 3e-4, "weight_decay": 0.0, "group": {"muon": True}}),
])
def test_optimizers_move_locked_weights_with_stochastic_and_kahan(opt_cls, kw):
    """AdamW and Muon at an lr whose per-step updates (~5e-5) are far under half an ulp at
    |w| ~ 1 (2^-9): nearest leaves the bf16 weights where they were; stochastic and Kahan
    move them by what fp32 weights move over 300 steps (mean move within 20%; the
    stochastic mean over 512 entries has a standard error <= 2^-7 / 2 / sqrt(512) = 1.7e-4,
    under 6% of the smaller, Muon's, move)."""
    fp32 = _train(opt_cls, "nearest", torch.float32, **dict(kw))
    assert _train(opt_cls, "nearest", torch.bfloat16, **dict(kw)).abs().max() == 0
    for mode in ("stochastic", "kahan"):
        moved = _train(opt_cls, mode, torch.bfloat16, **dict(kw))
        assert abs(moved.mean() - fp32.mean()) < 0.2 * fp32.mean().abs(), mode


def test_fp32_parameters_ignore_the_mode():
    """fp32 parameters (LoRA adapters, fp32 runs) are updated in place in every mode."""
    outs = [_train(AdamW, m, torch.float32, steps=5, lr=1e-3) for m in
            ("nearest", "stochastic", "kahan")]
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_refused_with_other_precisions():
    cpu = torch.device("cpu")
    assert resolve_precision("bf16-true", cpu, "fp32", "kahan").bf16_update == "kahan"
    for precision in ("fp32", "bf16-mixed", "auto"):
        with pytest.raises(ConfigError, match="bf16_update: 'stochastic' needs --precision "
                                              "bf16-true") as e:
            resolve_precision(precision, cpu, "fp32", "stochastic")
        assert "\n" not in str(e.value)
    assert resolve_precision("fp32", cpu, "fp32", "nearest").bf16_update == "nearest"


def test_flag_and_seeds():
    from astrai.config.section import flag
    from astrai.config.train import TrainConfig

    assert flag(("precision", "bf16_update"), TrainConfig) == "--bf16-update"
    assert rounding_seed(5, 1, "ddp") == rounding_seed(5, 0, "ddp") == 5  # identical bits
    assert rounding_seed(5, 1, "fsdp") != rounding_seed(5, 0, "fsdp")  # own streams


def test_runs_saved_before_the_option_resume_nearest(tmp_path):
    """A run saved before --bf16-update existed (no bf16_update key in its saved config)
    rounded to nearest; its resume keeps doing so (auto would now pick stochastic):
    bit-identical to an uninterrupted nearest run."""
    import json
    import shutil
    from pathlib import Path

    from astrai.train import resume, train
    from astrai.train.run import find_resume_point

    from .conftest import make_config, make_data
    from .test_resume import final_weights

    kw = {"precision": "bf16-true", "bf16_update": "nearest", "max_lr": 1e-4, "max_steps": 4,
          "ckpt_interval": 2}
    a = train(make_config(tmp_path / "a", **kw), data=make_data(n=16))
    run = Path(train(make_config(tmp_path / "b", **kw), data=make_data(n=16)).run_dir)
    shutil.rmtree(run / "checkpoints" / "step_4")  # resume from step 2
    for f in (run / "train_config.json", run / "checkpoints" / "step_2" / "meta.json"):
        saved = json.loads(f.read_text())
        del saved.get("train_config", saved)["precision"]["bf16_update"]  # as saved before
        f.write_text(json.dumps(saved))
    assert find_resume_point(run)[0].precision.update_mode == "nearest"
    resume(run, data=make_data(n=16))
    assert final_weights(run, 4) == final_weights(Path(a.run_dir), 4)


def _mixed_params() -> dict[str, torch.nn.Parameter]:
    """A bf16-true model with fp32 tensors beside it (LoRA-style adapters, fp32 gains)."""
    torch.manual_seed(0)
    return {"bf16_w": torch.nn.Parameter(torch.randn(32, 16).bfloat16()),
            "bf16_g": torch.nn.Parameter(torch.ones(16).bfloat16()),
            "fp32_w": torch.nn.Parameter(torch.randn(8, 16)),
            "fp32_b": torch.nn.Parameter(torch.zeros(8))}


def _state_bytes(state: dict) -> int:
    return sum(v.numel() * v.element_size() for v in state.values() if torch.is_tensor(v)
               and v.dim() > 0)


@pytest.mark.parametrize("opt_cls", [AdamW, MuonAdamW])
@pytest.mark.parametrize("mode", ["stochastic", "kahan"])
def test_no_update_buffers_for_fp32_parameters(opt_cls, mode, tmp_path):
    """Only bf16 weights get what a mode adds: Kahan's bf16 compensation (2 B/param) for
    each bf16 parameter, nothing for fp32 ones (their update is exact), and stochastic
    rounding no per-parameter state at all. Checked on the live state and on the state
    saved as a checkpoint's optimizer.pt (torch.save of optimizer.state_dict())."""
    def run(m: str) -> tuple[dict, dict]:
        params = _mixed_params()
        groups = [{"params": [params["bf16_w"], params["fp32_w"]], "muon": True},
                  {"params": [params["bf16_g"], params["fp32_b"]], "muon": False}]
        opt = opt_cls(groups if opt_cls is MuonAdamW else [p for g in groups for p in g["params"]],
                      lr=1e-3, bf16_update=m)
        for _ in range(3):
            for p in params.values():
                p.grad = torch.ones_like(p)
            opt.step()
        torch.save(opt.state_dict(), tmp_path / f"{m}-optimizer.pt")
        saved = torch.load(tmp_path / f"{m}-optimizer.pt", weights_only=True)["state"]
        order = [p for g in opt.param_groups for p in g["params"]]
        names = {id(p): n for n, p in params.items()}
        live = {names[id(p)]: opt.state[p] for p in order}
        return live, {names[id(p)]: saved[i] for i, p in enumerate(order)}

    nearest_live, nearest_saved = run("nearest")
    live, saved = run(mode)
    for name in ("fp32_w", "fp32_b"):
        for ref, got in ((nearest_live, live), (nearest_saved, saved)):
            assert set(got[name]) == set(ref[name]), (name, sorted(got[name]))
            assert _state_bytes(got[name]) == _state_bytes(ref[name]), name
    for name in ("bf16_w", "bf16_g"):
        for ref, got in ((nearest_live, live), (nearest_saved, saved)):
            extra = set(got[name]) - set(ref[name])
            assert extra == ({KAHAN_KEY} if mode == "kahan" else set()), (name, extra)
            comp = got[name].get(KAHAN_KEY)
            assert comp is None or (comp.dtype == torch.bfloat16
                                    and comp.shape == _mixed_params()[name].shape)
