"""A tiny checkpoint (random weights, tiny trained tokenizer) for benchmark tests."""

import pytest

from astrai.data.testing import tiny_tokenizer
from astrai.model import ModelConfig, build_model
from astrai.model.checkpoint import save_checkpoint


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-ckpt")
    tok = tiny_tokenizer(root)
    cfg = ModelConfig(vocab_size=tok.vocab_size, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                      ffn_dim=128, max_seq_len=256)
    model = build_model(cfg, seed=0)
    return save_checkpoint(root / "ckpt", model, cfg, tokenizer_dir=tok.path)
