"""`--model PRESET|CONFIG|CHECKPOINT|HF_DIR` against the dataset's tokenizer."""

import json

import pytest
import torch

from astrai.data.testing import tiny_tokenizer
from astrai.errors import ConfigError
from astrai.model import build_model, get_preset
from astrai.model.checkpoint import save_checkpoint
from astrai.model.hf_export import export_hf
from astrai.train.model_source import resolve_model

SMALL = {"dim": 32, "n_layers": 1, "n_heads": 2, "ffn_dim": 64, "max_seq_len": 64}


@pytest.fixture
def tok(tmp_path):
    t = tiny_tokenizer(tmp_path, 512)
    return tmp_path / "tokenizer-512", t.fingerprint()


def test_preset_takes_tokenizer_vocab_and_length(tok):
    src = resolve_model("tiny", vocab_size=512, seq_len=2048, seed=0,
                        overrides={"n_layers": 1})
    assert src.config.vocab_size == 512 and src.config.max_seq_len == 2048
    assert src.config.n_layers == 1 and src.kind == "preset"
    m1, m2 = src.model_fn(), src.model_fn()
    for a, b in zip(m1.state_dict().values(), m2.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # seeded init


def test_config_file_vocab_must_hold_tokenizer(tmp_path):
    f = tmp_path / "m.json"
    f.write_text(json.dumps({**SMALL, "vocab_size": 300}))
    with pytest.raises(ConfigError, match="vocab_size 300 is smaller than the dataset"):
        resolve_model(str(f), vocab_size=512, seq_len=32, seed=0)
    f.write_text(json.dumps(SMALL))  # no vocab_size: the tokenizer's
    assert resolve_model(str(f), vocab_size=512, seq_len=32, seed=0).config.vocab_size == 512


def test_checkpoint_and_hf_dir(tok, tmp_path):
    tok_dir, fp = tok
    cfg = get_preset("tiny", vocab_size=512, **SMALL)
    ckpt = save_checkpoint(tmp_path / "ck", build_model(cfg, seed=1), cfg, tokenizer_dir=tok_dir)
    src = resolve_model(str(ckpt), vocab_size=512, seq_len=32, seed=0, tokenizer_fingerprint=fp)
    assert src.kind == "checkpoint" and src.model_fn().training
    with pytest.raises(ConfigError, match="tokenizer differs from the dataset's"):
        resolve_model(str(ckpt), vocab_size=512, seq_len=32, seed=0,
                      tokenizer_fingerprint="0000")
    with pytest.raises(ConfigError, match="max_seq_len 64 is shorter"):
        resolve_model(str(ckpt), vocab_size=512, seq_len=128, seed=0)
    with pytest.raises(ConfigError, match="cannot change the architecture"):
        resolve_model(str(ckpt), vocab_size=512, seq_len=32, seed=0, overrides={"dim": 64})
    hf = export_hf(ckpt, tmp_path / "hf")
    src = resolve_model(str(hf), vocab_size=512, seq_len=32, seed=0, tokenizer_fingerprint=fp)
    ours = src.model_fn().state_dict()
    for k, v in build_model(cfg, seed=1).state_dict().items():
        torch.testing.assert_close(ours[k].float(), v)
    with pytest.raises(ConfigError, match="neither a preset"):
        resolve_model("no-such-thing", vocab_size=512, seq_len=32, seed=0)
