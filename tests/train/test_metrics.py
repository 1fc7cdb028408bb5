"""metrics.jsonl: fields, grad norm of this step, validation loss / perplexity / bpb."""

import json
import math
from pathlib import Path

import pytest
import torch

from astrai.data.testing import tiny_tokenizer
from astrai.model.checkpoint import load_checkpoint
from astrai.train import train
from astrai.data.bpb import token_byte_lengths
from astrai.train.callbacks import Callback

from .conftest import collate, make_data


class GradNorm(Callback):
    name = "gradnorm"

    def __init__(self):
        self.norms = []

    def on_optimizer_step(self, ctx, control):  # runs after the clipping callback
        grads = [p.grad for p in ctx.model.parameters() if p.grad is not None]
        self.norms.append(float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))))


def read(run_dir):
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def test_records_and_unclipped_grad_norm(tiny_config):
    cb = GradNorm()
    s = train(tiny_config(max_grad_norm=0), data=make_data(n=16), callbacks=[cb])
    recs = read(s.run_dir)
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    for r, norm in zip(recs, cb.norms, strict=True):
        assert r["grad_norm"] == pytest.approx(norm, rel=1e-5)
        for key in ("loss", "lr", "tokens_per_s", "mfu", "memory_mb", "consumed_samples",
                    "seq_loss", "loss_tokens", "elapsed_s"):
            assert key in r
        assert r["tokens"] == 4 * 16 and r["loss"] == pytest.approx(r["seq_loss"])


def test_clipping_logs_preclip_norm_and_clips(tiny_config):
    cb = GradNorm()
    s = train(tiny_config(max_grad_norm=1e-3), data=make_data(n=16), callbacks=[cb])
    for r, clipped in zip(read(s.run_dir), cb.norms, strict=True):
        assert clipped == pytest.approx(1e-3, rel=1e-3)
        assert r["grad_norm"] > 1e-2


def test_validation_loss_ppl_and_bits_per_byte(tiny_config, tmp_path):
    tiny_tokenizer(tmp_path)
    data = make_data(n=16, eval_n=6)
    data.tokenizer_dir, data.vocab_size = tmp_path / "tokenizer-512", 512
    s = train(tiny_config(eval_interval=2), data=data)
    recs = read(s.run_dir)
    assert ["val_loss" in r for r in recs] == [False, True, False, True]
    last = recs[-1]
    # recompute on the final checkpoint by hand
    model, _, _ = load_checkpoint(s.checkpoint)
    batch = collate([data.eval_dataset[i] for i in range(6)])
    with torch.no_grad():
        logp = torch.log_softmax(model(batch["input_ids"]).logits.double(), -1)
    nll = -logp.gather(-1, batch["target_ids"][..., None]).sum()
    n = batch["target_ids"].numel()
    nbytes = int(token_byte_lengths(data.tokenizer_dir)[batch["target_ids"]].sum())
    assert last["val_loss"] == pytest.approx(float(nll) / n, rel=1e-5)
    assert last["val_ppl"] == pytest.approx(math.exp(float(nll) / n), rel=1e-5)
    assert last["val_bpb"] == pytest.approx(float(nll) / math.log(2) / nbytes, rel=1e-5)
    assert s.validation == {k: last[k] for k in ("val_loss", "val_ppl", "val_bpb")}


def test_mfu_peak_is_measured_again_when_a_step_beats_it():
    """A peak measured at a slow moment (a busy machine) is taken again once a step appears
    to beat it, so MFU stays a fraction; a given peak is never re-measured."""
    from astrai.train.flops import DevicePeak

    later = iter([3e9, 8e9, 9e9])
    peak = DevicePeak(1e9, lambda: next(later))
    assert peak.mfu(0.5e9) == 0.5  # below the peak: nothing measured
    assert peak.mfu(4e9) == 4e9 / 8e9  # two measurements until the peak exceeds the step
    assert peak.flops == 8e9 and peak.remeasures_left == 1
    slow = DevicePeak(1e9, lambda: 1e9, remeasure=2)
    assert slow.mfu(2e9) == 2.0  # still above after fresh measurements: reported as is
    assert DevicePeak(1e9).mfu(2e9) == 2.0  # --peak-tflops is taken at its word


def test_measured_peak_is_per_thread_count():
    import torch

    from astrai.train.flops import _timed_matmul, measure_peak_flops

    threads = torch.get_num_threads()
    _timed_matmul.cache_clear()
    try:
        torch.set_num_threads(1)
        measure_peak_flops("cpu", torch.float32, 64, 0.01)
        torch.set_num_threads(2)
        measure_peak_flops("cpu", torch.float32, 64, 0.01)
    finally:
        torch.set_num_threads(threads)
    assert _timed_matmul.cache_info().currsize == 2
