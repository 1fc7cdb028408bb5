"""Next-update visibility (astrai.inspect.visibility / next_update): the prediction matches
the optimizer's own write, and `inspect-weights RUN --all-checkpoints` counts equal a
direct computation from each checkpoint's files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from astrai.inspect.visibility import adam_step, half_ulp, lr_to_move, rounds_away
from astrai.train import train
from astrai.train.adamw import AdamW
from astrai_cli.main import app

from .conftest import make_data


def test_adam_step_predicts_the_optimizers_write():
    """With v = m^2 and the gradient equal to m, one AdamW step keeps both moments, so the
    update it applies is adam_step's prediction: the entries it leaves unchanged are
    those rounds_away names (fp32 op order may differ: a few boundary cases allowed)."""
    g = torch.Generator().manual_seed(0)
    w = torch.exp2(5 * torch.rand(64, 64, generator=g) - 3).bfloat16()  # |w| in [1/8, 4)
    m = (torch.randn(64, 64, generator=g) * 1e-2).bfloat16().float()  # the bf16 gradient
    p = torch.nn.Parameter(w.clone())
    opt = AdamW([p], lr=4e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt.state[p].update(step=torch.tensor(5.0), exp_avg=m.clone(), exp_avg_sq=m.square())
    p.grad = m.bfloat16()
    opt.step()
    moved = p.detach() != w
    predicted = ~rounds_away(w, adam_step(w, m, m.square(), 5, lr=4e-3, betas=(0.9, 0.95),
                                          eps=1e-8, weight_decay=0.1))
    assert 0.05 < moved.float().mean() < 0.95  # the case is not trivial either way
    assert (moved != predicted).sum() <= 4


def test_half_ulp_and_lr_to_move():
    w = torch.tensor([1.0, 1.5, 2.0, -3.0, 0.0]).bfloat16()
    assert half_ulp(w)[:4].tolist() == [2**-8, 2**-8, 2**-7, 2**-7]
    assert half_ulp(w)[4] > 0
    u = torch.full((4,), 1e-4)
    # half ulp 2^-8 at |w| in [1, 2): the lr that moves half the entries scales lr by it
    lr = lr_to_move(torch.ones(4).bfloat16(), u, 1e-3)
    assert abs(lr - 1e-3 * 2**-8 / 1e-4) < 1e-9
    assert lr_to_move(w, torch.zeros(5), 1e-3) is None


def _direct_counts(ckpt) -> dict[str, tuple[int, int]]:
    """Per tensor (entries, below half ulp), written out again from the files: AdamW's step
    from the saved moments with step + 1's bias corrections, then the bf16 write."""
    opt = torch.load(ckpt / "optimizer.pt", weights_only=True)
    weights = load_file(str(ckpt / "model.safetensors"))
    out = {}
    for group in opt["param_groups"]:
        b1, b2 = group["betas"]
        for i in group["params"]:
            name, st = opt["param_names"][i], opt["state"][i]
            w, t = weights[name], float(st["step"]) + 1
            m, v = st["exp_avg"].double(), st["exp_avg_sq"].double()
            u = group["lr"] * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + group["eps"])
            u = u + group["lr"] * group["weight_decay"] * w.double()
            same = (w.double() - u).float().bfloat16() == w
            out[name] = (w.numel(), int(same.sum()))
    return out


def test_inspect_weights_all_checkpoints_counts_equal_a_direct_computation(tiny_config):
    cfg = tiny_config(precision="bf16-true", max_lr=1e-4, ckpt_interval=2, guard_bf16=False)
    run_dir = Path(train(cfg, data=make_data(n=16)).run_dir)
    r = CliRunner().invoke(app, ["inspect-weights", str(run_dir), "--all-checkpoints",
                                 "--json"])
    assert r.exit_code in (0, 1), r.output
    report = json.loads(r.stdout)
    ckpts = report["checkpoints"]
    assert [c["step"] for c in ckpts] == [2, 4]
    for c in ckpts:
        direct = _direct_counts(run_dir / "checkpoints" / f"step_{c['step']}")
        ours = {t["name"]: (t["entries"], t["below_half_ulp"])
                for t in c["next_update"]["tensors"]}
        assert ours.keys() == direct.keys()
        for name, (n, below) in direct.items():
            assert ours[name][0] == n
            assert abs(ours[name][1] - below) <= max(2, n // 1000), name
        # at lr 1e-4 most bf16 entries near 1 cannot move: the norm gains at least
        gains = [t for t in c["next_update"]["tensors"] if t["name"].endswith("norm.weight")]
        assert gains and all(t["fraction"] > 0.9 for t in gains)
        assert all(t["lr_to_move"] is None or t["lr_to_move"] > 1e-4 for t in gains)


def test_muon_matrices_take_muons_step(tiny_config):
    cfg = tiny_config(precision="bf16-true", optimizer="muon", max_lr=1e-4, ckpt_interval=4,
                      guard_bf16=False)
    run_dir = Path(train(cfg, data=make_data(n=16)).run_dir)
    r = CliRunner().invoke(app, ["inspect-weights", str(run_dir), "--json"])
    tensors = json.loads(r.stdout)["checkpoints"][0]["next_update"]["tensors"]
    kinds = {t["name"]: t["optimizer"] for t in tensors}
    assert kinds["layers.0.attn.q_proj.weight"] == "muon"
    assert kinds["layers.0.attn_norm.weight"] == "adamw"
    r = CliRunner().invoke(app, ["inspect-weights", str(run_dir), "--plot",
                                 str(run_dir / "lockin.svg")])
    assert "Next update below half an ulp" in r.stdout
    svg = (run_dir / "lockin.svg").read_text()
    assert 'id="below_half_ulp' in svg and 'id="locked_fraction' in svg


def _records(run_dir):
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", ["nearest", "stochastic"])
def test_guard_logs_the_visible_update_fraction_and_names_the_fix(tiny_config, caplog, mode):
    """At lr 1e-7 almost no bf16 weight can move to nearest (only |w| < ~2.6e-5): the
    visible fraction is ~0 and the warning names the cures, once per group; under
    stochastic rounding the warning does not suggest the mode already in use."""
    cfg = tiny_config(precision="bf16-true", max_lr=1e-7, guard_every=1, bf16_update=mode)
    with caplog.at_level(logging.WARNING):
        run_dir = train(cfg, data=make_data(n=16)).run_dir
    recs = _records(run_dir)
    gains = [r["update_visible/adamw-no-decay"] for r in recs]
    assert len(gains) == len(recs) and all(0.0 <= v <= 1.0 for v in gains)
    warned = [r.getMessage() for r in caplog.records if "changed at this step" in r.getMessage()]
    if mode == "nearest":
        assert max(gains) < 0.05
        msg = next(m for m in warned if "'adamw-no-decay'" in m)
        assert "--bf16-update stochastic" in msg and "bf16-mixed" in msg
        assert "learning rate of at least" in msg
        assert sum("'adamw-no-decay'" in m for m in warned) == 1  # once per group
    else:
        assert not any("--bf16-update stochastic" in m for m in warned)


def test_update_watch_equals_a_full_diff_when_it_samples_everything():
    from astrai.inspect.update_watch import UpdateWatch

    g = torch.Generator().manual_seed(3)
    ps = [torch.nn.Parameter(torch.randn(n, generator=g).bfloat16()) for n in (100, 300)]
    opt = torch.optim.SGD([{"params": ps, "name": "a"}], lr=1.0)
    watch = UpdateWatch(per_tensor=1000)
    before = [p.detach().clone() for p in ps]
    watch.take(opt)
    with torch.no_grad():
        ps[0][:37] += 1.0
        ps[1][::3] += 1.0
    changed = sum(int((p.detach() != b).sum()) for p, b in zip(ps, before))
    assert watch.fractions() == {"a": changed / 400}
    assert watch.fractions() == {}  # the sample is used once


def test_guard_steps_are_recorded_whatever_the_log_interval(tiny_config):
    """The guard's checked steps (the first, every guard_every) write their record, so
    update_visible/* and lockin/* reach metrics.jsonl (and TensorBoard) even when
    --log-interval skips those steps."""
    cfg = tiny_config(precision="bf16-true", max_lr=1e-5, guard_every=2, max_steps=6,
                      log_interval=3)
    recs = {r["step"]: r for r in _records(train(cfg, data=make_data(n=32)).run_dir)}
    assert sorted(recs) == [1, 2, 3, 4, 6]  # 3: the log interval; 1, 2, 4, 6: the guard
    for step in (1, 2, 4, 6):
        assert "update_visible/adamw" in recs[step], recs[step]
    assert all("lockin/locked" in recs[s] for s in (2, 4, 6))
    assert "update_visible/adamw" not in recs[3]


def test_inspect_a_b_counts_equal_a_direct_diff(tiny_config):
    """`inspect-weights A B` on two checkpoints of a bf16-true run: every tensor's moved
    entries equal a direct bitwise diff of the two model.safetensors files."""
    cfg = tiny_config(precision="bf16-true", bf16_update="nearest", max_lr=1e-4,
                      ckpt_interval=2, keep_last=0, max_steps=4, guard_bf16=False)
    run_dir = Path(train(cfg, data=make_data(n=16)).run_dir)
    a, b = (run_dir / "checkpoints" / f"step_{s}" for s in (2, 4))
    r = CliRunner().invoke(app, ["inspect-weights", str(a), str(b), "--json"])
    assert r.exit_code in (0, 1), r.output
    stuck = json.loads(r.stdout)["stuck"]["tensors"]
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert {t["name"] for t in stuck} == set(wa)
    for t in stuck:
        moved = int((wa[t["name"]].view(torch.int16) != wb[t["name"]].view(torch.int16)).sum())
        assert t["numel"] - t["stuck"] == moved, t["name"]
    assert any(t["stuck"] for t in stuck) and any(t["numel"] > t["stuck"] for t in stuck)
