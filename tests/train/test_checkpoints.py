"""Checkpoint step naming, contents, keep-last, tokenizer copy."""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from astrai.data.testing import tiny_tokenizer
from astrai.model.checkpoint import load_checkpoint
from astrai.train import train
from astrai.train.callbacks import Callback
from astrai.train.checkpointing import list_checkpoints

from .conftest import make_data


class Snapshots(Callback):
    name = "snapshots"

    def __init__(self):
        self.before, self.after = {}, {}

    def _state(self, ctx):
        return {k: v.detach().clone() for k, v in ctx.model.state_dict().items()}

    def on_optimizer_step(self, ctx, control):  # before optimizer.step() of step N+1
        self.before[ctx.state.step + 1] = self._state(ctx)

    def on_step_end(self, ctx, report, control):  # after the step: the weights of step N
        self.after[ctx.state.step] = self._state(ctx)


def test_checkpoint_step_n_holds_weights_after_step_n(tiny_config):
    snap = Snapshots()
    s = train(tiny_config(ckpt_interval=2, keep_last=0), data=make_data(n=24),
              callbacks=[snap])
    ckpts = list_checkpoints(Path(s.run_dir) / "checkpoints")
    assert [n for n, _ in ckpts] == [2, 4, 6]
    for n, path in ckpts:
        saved = load_file(str(path / "model.safetensors"))
        for k, v in saved.items():
            assert torch.equal(v, snap.after[n][k]), (n, k)
        # not the pre-step weights under the new name
        assert any(not torch.equal(v, snap.before[n][k]) for k, v in saved.items())
        meta = json.loads((path / "meta.json").read_text())
        assert meta["step"] == n and meta["train_config"]["checkpoint"]["interval"] == 2
        ts = torch.load(path / "trainer_state.pt", weights_only=True)
        assert ts["state"]["step"] == n and ts["rng"] is not None
        assert torch.load(path / "scheduler.pt", weights_only=True)["step_count"] == n
        opt = torch.load(path / "optimizer.pt", weights_only=True)
        assert int(opt["state"][0]["step"]) == n
    assert (Path(s.run_dir) / "latest").read_text().strip() == "checkpoints/step_6"


def test_keep_last_and_final_checkpoint(tiny_config):
    s = train(tiny_config(ckpt_interval=2, keep_last=2, max_steps=7), data=make_data(n=16))
    ckpts = [n for n, _ in list_checkpoints(Path(s.run_dir) / "checkpoints")]
    assert ckpts == [6, 7]  # the end is always saved; only the newest 2 kept


def test_checkpoint_carries_dataset_tokenizer_and_loads(tiny_config, tmp_path):
    tok = tiny_tokenizer(tmp_path)
    data = make_data(n=8)
    data.tokenizer_dir, data.vocab_size = Path(tok_dir := tmp_path / "tokenizer-512"), 512
    assert tok_dir.is_dir() and tok.vocab_size == 512
    s = train(tiny_config(), data=data)
    path = Path(s.checkpoint)
    assert (path / "tokenizer.json").is_file() and (path / "chat_template.jinja").is_file()
    _, config, meta = load_checkpoint(path)
    assert config.vocab_size == 512 and meta["step"] == s.steps == 2
