"""A tiny sharp model with a real (tiny) tokenizer, as an astrai checkpoint and as its
exported HF twin (the same weights and tokenizer files, for lm-eval's `hf` model)."""

from __future__ import annotations

import os

import pytest
import torch

from astrai.data.testing import tiny_tokenizer
from astrai.model import build_model, get_preset
from astrai.model.checkpoint import save_checkpoint
from astrai.model.hf_export import export_hf

# lm-eval reads local JSON data through `datasets`: never reach for the hub.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def tiny_config(**kw):
    # init_std 0.2: peaked, context-dependent predictions (distinct choices and generations)
    base = {"vocab_size": 512, "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
            "head_dim": 16, "ffn_dim": 128, "max_seq_len": 64, "init_std": 0.2}
    return get_preset("tiny", **{**base, **kw})


@pytest.fixture(scope="session")
def tok(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=512)


@pytest.fixture(scope="session")
def model():
    return build_model(tiny_config(), seed=0).eval()


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory, model, tok):
    return save_checkpoint(tmp_path_factory.mktemp("eval") / "ckpt", model, model.config,
                           tokenizer_dir=tok.path)


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory, ckpt):
    out = tmp_path_factory.mktemp("eval_hf") / "hf"
    export_hf(ckpt, out)
    return out


@pytest.fixture(scope="package", autouse=True)
def one_thread_eval():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
