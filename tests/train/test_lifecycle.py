"""The callback lifecycle of the AstrAI training guide (plus on_step_end), in order."""

from pathlib import Path

import pytest

from astrai.train import train
from astrai.train.callbacks import HOOKS, Callback

from .conftest import make_data


class Recorder(Callback):
    name = "recorder"

    def __init__(self, fail_at=None):
        self.events, self.fail_at = [], fail_at
        for hook in HOOKS:
            setattr(self, hook, self._make(hook))

    def _make(self, hook):
        def record(ctx, *args):
            self.events.append(hook)
            if hook == self.fail_at:
                raise RuntimeError(f"boom in {hook}")
        return record

    def on_error(self, ctx, error):
        self.events.append("on_error")


def expected(epochs, windows, accum):
    ev = ["on_train_begin"]
    for _ in range(epochs):
        ev.append("on_epoch_begin")
        for _ in range(windows):
            for _ in range(accum):
                ev += ["on_batch_begin", "on_batch_end"]
            ev += ["on_optimizer_step", "on_step_end"]
        ev.append("on_epoch_end")
    return [*ev, "on_train_end"]


def test_hook_order(tiny_config):
    rec = Recorder()
    # 20 samples / 4 = 5 micro-batches; accum 2 -> 2 windows per epoch (1 leftover unused)
    train(tiny_config(grad_accum_steps=2, epochs=2), data=make_data(n=20), callbacks=[rec])
    assert rec.events == expected(2, 2, 2)


def test_error_fires_on_error_then_on_train_end(tiny_config):
    rec = Recorder(fail_at="on_optimizer_step")
    with pytest.raises(RuntimeError, match="boom"):
        train(tiny_config(), data=make_data(n=16), callbacks=[rec])
    assert rec.events[-3:] == ["on_optimizer_step", "on_error", "on_train_end"]


def test_no_train_end_when_train_begin_fails(tiny_config):
    rec = Recorder(fail_at="on_train_begin")
    with pytest.raises(RuntimeError):
        train(tiny_config(), data=make_data(n=16), callbacks=[rec])
    assert rec.events == ["on_train_begin"]


def test_registration_order_does_not_change_the_run(tiny_config, tmp_path):
    """Callbacks only observe: the default set reversed gives the same metrics records and
    the same final weights."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    from astrai.train.callbacks import default_callbacks
    from astrai.train.run import run_paths

    runs = []
    for reverse in (False, True):
        cfg = tiny_config(out=str(tmp_path / f"run{int(reverse)}"), guard_bf16=True, guard_every=2,
                          eval_interval=2)
        cbs = default_callbacks(cfg)
        if reverse:
            cbs = cbs[::-1]
        s = _train_with(cfg, cbs)
        recs = [json.loads(x) for x in run_paths(cfg).metrics.read_text().splitlines()]
        for r in recs:
            for k in ("tokens_per_s", "mfu", "memory_mb", "elapsed_s"):
                r.pop(k)
        runs.append((recs, load_file(str(Path(s.checkpoint) / "model.safetensors"))))
    assert runs[0][0] == runs[1][0]
    assert any("lockin/locked" in r for r in runs[1][0])  # the guard's figures were logged
    for k, v in runs[0][1].items():
        assert (v == runs[1][1][k]).all()


def _train_with(cfg, callbacks):
    """train() with exactly these callbacks in this order (the defaults replaced)."""
    from unittest import mock

    from astrai.train import run

    with mock.patch.object(run, "default_callbacks", lambda *a, **k: callbacks):
        return run.train(cfg, data=make_data(n=16, eval_n=4))


def test_a_run_that_fails_before_its_first_checkpoint_leaves_no_run_dir(tiny_config):
    """Nothing to resume was made: no directory that `train` would refuse and `resume`
    could not use."""
    class Boom(Callback):
        name = "boom"

        def on_train_begin(self, ctx):  # e.g. a reference model that cannot be loaded
            raise RuntimeError("boom")

    cfg = tiny_config(max_steps=3)
    with pytest.raises(RuntimeError, match="boom"):
        train(cfg, data=make_data(n=16), callbacks=[Boom()])
    assert not Path(cfg.out).exists()
