"""Real datasets as TrainData (val split, eval data, crop), the progress bar, seq doc_mask."""

import io

import pytest
import torch
from rich.console import Console

from astrai.data.testing import tiny_dataset
from astrai.errors import ConfigError, DataError
from astrai.model import ForwardContext, build_model, get_preset
from astrai.train import train
from astrai.train.callbacks import ProgressCallback
from astrai.train.data import open_train_data
from astrai.train.strategies import STRATEGIES

from .conftest import TINY, VOCAB, collate, make_data, sft_samples


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    return {"pretrain": tiny_dataset(root, "pretrain", n=24, n_val=4),
            "sft": tiny_dataset(root, "sft", n=32, n_val=8)}


def test_open_train_data_splits_and_crop(ds):
    d = open_train_data(str(ds["pretrain"]))
    assert d.kind == "pretrain" and d.eval_dataset is not None  # the dataset's val split
    assert d.vocab_size == 512 and (d.tokenizer_dir / "tokenizer.json").is_file()
    n = len(d.dataset)
    held = open_train_data(str(ds["pretrain"]), val_split=0.25)
    assert len(held.dataset) + len(held.eval_dataset) == n
    assert len(held.eval_dataset) == round(n * 0.25)
    cropped = open_train_data(str(ds["pretrain"]), window_size=32)
    batch = cropped.collate_fn([cropped.dataset[0], cropped.dataset[1]])
    assert cropped.seq_len == 32 and batch["input_ids"].shape == (2, 32)
    assert batch["target_ids"].shape == (2, 32)
    with pytest.raises(ConfigError, match="exceeds the dataset's row length"):
        open_train_data(str(ds["pretrain"]), window_size=10_000)
    with pytest.raises(DataError, match="is a sft dataset"):
        open_train_data(str(ds["pretrain"]), eval_path=str(ds["sft"]))
    other = open_train_data(str(ds["pretrain"]), eval_path=str(ds["pretrain"]))
    assert len(other.eval_dataset) == n


def test_sft_sample_targets_follow_loss_mask(ds):
    d = open_train_data(str(ds["sft"]))
    s = d.dataset[0]
    assert ((s["target_ids"] != -100) == (s["loss_mask"] == 1)).all()
    assert 0 < int(s["loss_mask"].sum()) < len(s["loss_mask"])


def test_progress_bar_on_a_terminal_plain_lines_elsewhere(tiny_config):
    quiet, every, loud = io.StringIO(), io.StringIO(), io.StringIO()
    train(tiny_config(out=str(tiny_config().out) + "-q", max_steps=2), data=make_data(n=8),
          callbacks=[ProgressCallback(Console(file=quiet, force_terminal=False),
                                      interval_s=3600)])
    lines = quiet.getvalue().splitlines()  # not a terminal: a line at the last step only
    assert len(lines) == 1 and lines[0].startswith("step 2/2 (100%) · loss "), lines
    assert lines[0].endswith("ETA 0s") and "tok/s" in lines[0]
    train(tiny_config(out=str(tiny_config().out) + "-e", max_steps=3), data=make_data(n=8),
          callbacks=[ProgressCallback(Console(file=every, force_terminal=False), interval_s=0)])
    assert [x.split(" (")[0] for x in every.getvalue().splitlines()] == [
        "step 1/3", "step 2/3", "step 3/3"]
    train(tiny_config(max_steps=2), data=make_data(n=8),
          callbacks=[ProgressCallback(Console(file=loud, force_terminal=True, width=150))])
    out = loud.getvalue()
    assert "2/2" in out and "loss" in out and "tok/s" in out and "ETA" in out


def test_seq_doc_mask_uses_documents_and_positions():
    m = build_model(get_preset("tiny", vocab_size=VOCAB, **TINY), seed=0)
    batch = collate(sft_samples(2, 16))
    batch.pop("loss_mask")
    plain = STRATEGIES.get("seq")(m)(batch)["loss"]
    masked = STRATEGIES.get("seq")(m, doc_mask=True)(batch)["loss"]
    ctx = ForwardContext(positions=batch["position_ids"], doc_ids=batch["doc_ids"])
    logits = m(batch["input_ids"], ctx).logits
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["target_ids"].flatten())
    torch.testing.assert_close(masked.float(), want, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(plain, masked)


def test_progress_line_format():
    from astrai.train.callbacks.progress import progress_line

    assert progress_line(120, 696, 2.34561, 1e-3, 1234.4, 0.5) == (
        "step 120/696 (17%) · loss 2.3456 · lr 1.00e-03 · 1,234 tok/s · ETA 4m48s")
    assert progress_line(0, 10_000, 9.0, 3e-4, 10.0, 2.0).endswith("ETA 5h33m")
