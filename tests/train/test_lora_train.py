"""LoRA training runs: only adapters train (base bytes unchanged, optimizer state only for
adapters, fp32 with a bf16 base), checkpoints carry a PEFT adapter, kill -9 + resume is
bit-identical, an adapter continues with --adapter, the DPO reference is the base with
adapters disabled, and 2 ddp processes equal 1."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from astrai.config.train import TrainConfig
from astrai.errors import ConfigError
from astrai.model.adapter import read_adapter_weights
from astrai.model.lora import lora_layers
from astrai.train import resume, train
from astrai.train.callbacks import Callback
from astrai.train.checkpointing import list_checkpoints

from .conftest import make_config, make_data

REPO = Path(__file__).resolve().parents[2]
LORA = {"lora_rank": 4, "lora_alpha": 8.0, "lora_dropout": 0.1}


def ckpt(run_dir, step) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step}"


class Capture(Callback):
    """Keeps the run's context at the start (to look at the built model and optimizer)."""

    name = "capture"

    def on_train_begin(self, ctx):
        self.ctx = ctx
        self.adapter = {k: v.detach().clone() for k, v in ctx.model.state_dict().items()
                        if ".lora_" in k}


def test_only_adapters_train_and_checkpoints_hold_a_peft_adapter(tmp_path):
    cap = Capture()
    cfg = make_config(tmp_path, strategy="sft", max_steps=3, ckpt_interval=1, keep_last=0,
                      **LORA)
    train(cfg, data=make_data("sft"), callbacks=[cap])
    trainable = [n for n, p in cap.ctx.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    n_opt = sum(len(g["params"]) for g in cap.ctx.optimizer.param_groups)
    assert n_opt == len(trainable) == 2 * 7 * 2  # A and B x 7 targets x 2 layers
    # the frozen base is byte-identical in every checkpoint; the adapter moves
    assert (ckpt(cfg.out, 1) / "model.safetensors").read_bytes() == \
        (ckpt(cfg.out, 3) / "model.safetensors").read_bytes()
    assert not any(".lora_" in k for k in load_file(ckpt(cfg.out, 3) / "model.safetensors"))
    a1, a3 = (read_adapter_weights(ckpt(cfg.out, s) / "adapter") for s in (1, 3))
    assert a1.keys() == a3.keys() == cap.adapter.keys()
    assert any(not torch.equal(a1[k], a3[k]) for k in a1)
    assert any(torch.count_nonzero(v) for k, v in a3.items() if "lora_B" in k)


def test_bf16_base_keeps_fp32_adapters_and_moments(tmp_path):
    cap = Capture()
    cfg = make_config(tmp_path, strategy="seq", max_steps=2, precision="bf16-true", **LORA)
    train(cfg, data=make_data("pretrain"), callbacks=[cap])
    model = cap.ctx.model
    assert model.layers[0].attn.q_proj.weight.dtype == torch.bfloat16
    for _, layer in lora_layers(model):
        assert layer.lora_A.weight.dtype == layer.lora_B.weight.dtype == torch.float32
    states = list(cap.ctx.optimizer.state.values())
    assert states and all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32
                          for s in states)


@pytest.mark.parametrize("update", ["stochastic", "kahan"])
def test_bf16_update_with_lora_leaves_the_fp32_adapters_exact(update, tmp_path):
    """--bf16-update on a bf16-true base with LoRA: the trained adapters are fp32, so no
    write rounds; the run equals the nearest run byte for byte, with no Kahan buffers and
    no random draws (the frozen bf16 base takes no update at all): torch's fused AdamW
    keeps training them, as without the option."""
    cap = Capture()
    kw = {"strategy": "seq", "max_steps": 2, "precision": "bf16-true", **LORA}
    train(make_config(tmp_path / "a", **kw), data=make_data("pretrain"))
    train(make_config(tmp_path / "b", bf16_update=update, **kw), data=make_data("pretrain"),
          callbacks=[cap])
    writer = getattr(cap.ctx.optimizer, "writer", None)  # torch's fused AdamW: no writer
    assert writer is None or not writer.generators
    assert not any("kahan_comp" in s for s in cap.ctx.optimizer.state.values())
    f = "adapter/adapter_model.safetensors"
    assert (ckpt(tmp_path / "a" / "run", 2) / f).read_bytes() == \
        (ckpt(tmp_path / "b" / "run", 2) / f).read_bytes()


def test_interrupted_lora_run_resumes_bit_identical(tmp_path):
    """In process: a crash after micro-batch 3 (mid window), resumed (dropout on)."""

    class Stop(Callback):
        name = "stop"
        seen = 0

        def on_batch_end(self, ctx, micro):
            self.seen += 1
            if self.seen == 3:
                raise KeyboardInterrupt

    kw = {"strategy": "sft", "grad_accum_steps": 2, "epochs": 2, **LORA}
    a = train(make_config(tmp_path / "a", **kw), data=make_data("sft", n=20))
    cfg_b = make_config(tmp_path / "b", **kw)
    with pytest.raises(KeyboardInterrupt):
        train(cfg_b, data=make_data("sft", n=20), callbacks=[Stop()])
    assert [s for s, _ in list_checkpoints(Path(cfg_b.out) / "checkpoints")] == [1]
    b = resume(cfg_b.out, data=make_data("sft", n=20))
    assert b.steps == a.steps == 4
    for f in ("model.safetensors", "adapter/adapter_model.safetensors"):
        assert (ckpt(cfg_b.out, 4) / f).read_bytes() == (ckpt(a.run_dir, 4) / f).read_bytes()


KILL = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from astrai.train import train
from astrai.train.callbacks import Callback
from tests.train.conftest import make_config, make_data

class KillMidWindow(Callback):
    name = "kill"
    def on_batch_end(self, ctx, micro):
        if ctx.state.step == 2 and micro.index == 0:
            os.kill(os.getpid(), signal.SIGKILL)

cfg = make_config(Path(sys.argv[1]), **{kw!r})
train(cfg, data=make_data("sft", n=20), callbacks=[KillMidWindow()])
"""


def test_kill9_lora_run_then_resume_is_bit_identical(tmp_path):
    kw = {"strategy": "sft", "grad_accum_steps": 2, "epochs": 2, "ckpt_interval": 2, **LORA}
    a = train(make_config(tmp_path / "a", **kw), data=make_data("sft", n=20))
    proc = subprocess.run(
        [sys.executable, "-c", KILL.format(repo=str(REPO), kw=kw), str(tmp_path / "b")],
        check=False, capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    run_dir = tmp_path / "b" / "run"
    assert [s for s, _ in list_checkpoints(run_dir / "checkpoints")] == [2]
    b = resume(run_dir, data=make_data("sft", n=20))
    assert b.steps == a.steps == 4 and b.resumed_from.endswith("step_2")
    for f in ("model.safetensors", "adapter/adapter_model.safetensors", "optimizer.pt"):
        assert (ckpt(run_dir, 4) / f).read_bytes() == (ckpt(a.run_dir, 4) / f).read_bytes(), f


def test_train_continues_an_adapter_on_its_base(tmp_path):
    first = train(make_config(tmp_path / "a", strategy="sft", max_steps=2, **LORA),
                  data=make_data("sft"))
    step = Path(first.checkpoint)
    cap = Capture()
    train(make_config(tmp_path / "b", strategy="sft", max_steps=1, model=str(step),
                      model_overrides={}, adapter=str(step / "adapter")),
          data=make_data("sft"), callbacks=[cap])
    saved = read_adapter_weights(step / "adapter")
    assert cap.adapter.keys() == saved.keys()
    for k, v in saved.items():
        assert torch.equal(cap.adapter[k], v), k
    with pytest.raises(ConfigError, match="adapter directory fixes rank"):
        TrainConfig.from_dict({"adapter": str(step / "adapter"), "lora_rank": 2})


def test_lora_dpo_reference_is_the_base_with_adapters_disabled(tmp_path):
    """The reference log-probs equal the plain base model's, while the policy's differ;
    no second model is built."""
    from astrai.train.data import TrainData
    from astrai.train.strategies import StrategyInputs
    from astrai.train.strategies.dpo import DPOStrategy
    from astrai.train.strategies.reference import PolicyBase, reference_factory

    from .align_util import collate_pairs, preference_samples, tiny_model

    base = tiny_model()
    policy = tiny_model()
    from astrai.model.lora import LoraSpec, apply_lora

    apply_lora(policy, LoraSpec.build(4), seed=0)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _, layer in lora_layers(policy):
            layer.lora_B.weight.copy_(0.1 * torch.randn(layer.lora_B.weight.shape, generator=g))
    cfg = make_config(tmp_path, strategy="dpo", lora_rank=4)
    data = TrainData(dataset=[], kind="dpo", seq_len=16, collate_fn=None, vocab_size=64)
    ref_fn = reference_factory(StrategyInputs(config=cfg, data=data, device=torch.device("cpu")))
    assert ref_fn is PolicyBase
    strat = DPOStrategy(policy, beta=0.1, reference_fn=ref_fn)
    batch = collate_pairs(preference_samples(4, seed=1))
    ids, mask = batch["chosen"], batch["chosen_mask"]
    ref = strat.reference_sequence_logps(ids, mask)
    want = DPOStrategy(base, beta=0.1, reference=base).reference_sequence_logps(ids, mask)
    torch.testing.assert_close(ref, want, rtol=0, atol=1e-6)
    assert strat.reference().policy is policy
    assert all(layer.enabled for _, layer in lora_layers(policy))  # adapters back on
    # the policy itself (adapters on) differs from its reference
    mine = DPOStrategy(base, beta=0.1, reference=copy.deepcopy(policy)
                       ).reference_sequence_logps(ids, mask)
    assert not torch.allclose(mine, ref, atol=1e-3)
    assert strat(batch)["loss"].requires_grad  # the policy half keeps its graph


def lora_ddp_worker(out_root: str) -> None:
    from .dist_helpers import config_for, data_for

    train(config_for(Path(out_root) / "ddp", "sft", parallel="ddp", **LORA_NO_DROPOUT),
          data=data_for("sft"))


LORA_NO_DROPOUT = {"lora_rank": 4, "lora_alpha": 8.0}


@pytest.mark.slow
def test_two_ddp_processes_match_one_with_lora(tmp_path):
    from astrai.train.launch import run_workers

    from .dist_helpers import config_for, data_for, losses

    run_workers(lora_ddp_worker, (str(tmp_path),), nprocs=2)
    train(config_for(tmp_path / "one", "sft", batch_size=8, **LORA_NO_DROPOUT),
          data=data_for("sft"))
    two = read_adapter_weights(ckpt(tmp_path / "ddp" / "run", 3) / "adapter")
    one = read_adapter_weights(ckpt(tmp_path / "one" / "run", 3) / "adapter")
    assert any(torch.count_nonzero(v) for k, v in one.items() if "lora_B" in k)  # it trained
    for k in one:
        torch.testing.assert_close(two[k], one[k], atol=1e-6, rtol=0, msg=k)
    torch.testing.assert_close(losses(tmp_path / "ddp" / "run"), losses(tmp_path / "one" / "run"),
                               atol=1e-6, rtol=0)


def test_fsdp_with_lora_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="use --parallel ddp"):
        TrainConfig.from_dict({"lora_rank": 4, "parallel": "fsdp"})


def test_plan_counts_adapter_parameters_and_their_memory(tmp_path):
    """--dry-run: trainable parameters equal the built model's, and the gradient and
    optimizer memory follow the adapters, not the base."""
    from astrai.train.builder import prepare

    cap = Capture()
    cfg = make_config(tmp_path, strategy="sft", max_steps=1, lora_rank=4,
                      lora_targets=["q_proj,v_proj,down_proj"])
    plan = prepare(cfg, make_data("sft")).plan
    train(cfg, data=make_data("sft"), callbacks=[cap])
    n = sum(p.numel() for p in cap.ctx.model.parameters() if p.requires_grad)
    assert plan.trainable_params == n
    assert plan.memory_bytes["gradients"] == 4 * n
    assert plan.memory_bytes["optimizer"] == 8 * n
    full = prepare(make_config(tmp_path / "f", strategy="sft"), make_data("sft")).plan
    assert full.trainable_params is None and full.memory_bytes["optimizer"] == 8 * full.params
