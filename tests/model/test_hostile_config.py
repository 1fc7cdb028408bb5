"""A checkpoint's config.json is checked before anything is built from it: sizes within
bounds (astrai.model.config.LIMITS), and the blocks, experts and embedding the weights hold.
A hostile value is one line naming the file and the field, exit 2 — never a loop over 10^9
layers or a 4 TB RoPE table (the CLI cases run under a 4 GiB address-space limit)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

from astrai.data.testing import tiny_tokenizer
from astrai.errors import AstraiError, CheckpointError
from astrai.model import ModelConfig, build_model
from astrai.model.checkpoint import load_checkpoint, save_checkpoint
from astrai.model.config import LIMITS

SMALL = {"vocab_size": 64, "dim": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1,
         "ffn_dim": 64, "max_seq_len": 128}
HOSTILE = [  # (field values, the field the error names)
    ({"n_layers": 1e9}, "n_layers"), ({"n_layers": 1e5}, "n_layers"),
    ({"n_experts": 1e6, "moe_top_k": 2}, "n_experts"), ({"max_seq_len": 1e8}, "max_seq_len"),
    ({"max_seq_len": 1e12}, "max_seq_len"), ({"vocab_size": 1e12}, "vocab_size"),
    ({"dim": 2 ** 40, "n_heads": 2}, "dim"), ({"ffn_dim": 1e9}, "ffn_dim"),
    ({"n_layers": 0}, "n_layers"), ({"n_layers": -3}, "n_layers"),
    ({"n_layers": 2.5}, "n_layers"), ({"n_layers": True}, "n_layers"),
    ({"head_dim": 1 << 20}, "head_dim"),
    ({"max_seq_len": 1 << 20, "head_dim": 512}, "max_seq_len"),  # 2 GiB of RoPE tables
    *[(json.loads(f'{{"{k}": {v}}}'), k) for k, v in (  # JSON's own literals
        ("norm_eps", "Infinity"), ("rope_theta", "NaN"), ("init_std", "-Infinity"),
        ("moe_aux_loss_coef", "Infinity"))],
    ({"rope_scaling": {"type": "linear", "factor": float("inf")}}, "rope_scaling.factor"),
]


@pytest.mark.parametrize("values, field", HOSTILE)
def test_hostile_sizes_are_refused_naming_the_field(values, field):
    with pytest.raises(AstraiError, match=f"x/config.json: .*{field}") as e:
        ModelConfig.from_dict({**SMALL, **values}, source="x/config.json")
    assert "\n" not in str(e.value)


def test_the_largest_real_shapes_are_within_the_limits():
    """Llama 3.1 405B's shape, and a 1M-token context at head_dim 128 (Qwen2.5-1M)."""
    ModelConfig.from_dict({"vocab_size": 128256, "dim": 16384, "n_layers": 126,
                           "n_heads": 128, "n_kv_heads": 8, "ffn_dim": 53248,
                           "max_seq_len": 131072})
    ModelConfig.from_dict({**SMALL, "head_dim": 128, "max_seq_len": 1_010_000})
    assert LIMITS["n_layers"] >= 126


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    tok = tiny_tokenizer(root)
    cfg = ModelConfig.from_dict({**SMALL, "vocab_size": tok.vocab_size})
    return save_checkpoint(root / "ckpt", build_model(cfg, seed=0), cfg, tokenizer_dir=tok.path)


def tampered(ckpt, tmp_path, **values):
    import shutil

    out = tmp_path / "bad"
    shutil.copytree(ckpt, out)
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, **values}))
    return out


@pytest.mark.parametrize("values, message", [
    ({"n_layers": 1000}, "n_layers 1000 but the weights hold 2 blocks"),
    ({"n_experts": 1000, "moe_top_k": 2}, "n_experts 1000 but the weights hold 0 experts"),
    ({"vocab_size": 4_000_000}, "vocab_size 4000000 and dim 32 but embed_tokens.weight is"),
])
def test_a_config_that_lies_about_the_weights_is_refused_before_building(ckpt, tmp_path,
                                                                         values, message):
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tampered(ckpt, tmp_path, **values))


def limited():
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.mark.parametrize("values, field", [({"n_layers": 1e9}, "n_layers"),
                                           ({"n_experts": 1e6, "moe_top_k": 2}, "n_experts"),
                                           ({"max_seq_len": 1e12}, "max_seq_len"),
                                           ({"n_layers": 1000}, "n_layers 1000")])
@pytest.mark.parametrize("command", ["info", "export", "chat"])
def test_the_cli_says_one_line_and_exits_2(ckpt, tmp_path, values, field, command):
    bad = tampered(ckpt, tmp_path, **values)
    args = {"info": ["info", str(bad)],
            "export": ["export", str(bad), str(tmp_path / "out"), "--format", "hf"],
            "chat": ["chat", str(bad), "--prompt", "hi", "--device", "cpu"]}[command]
    r = subprocess.run([sys.executable, "-m", "astrai_cli.main", *args], capture_output=True,
                       text=True, timeout=120, preexec_fn=limited)
    err = r.stderr.strip()
    assert r.returncode == 2, err[-2000:]
    assert "Traceback" not in err and field in err and "config.json" in err
    assert not (tmp_path / "out").exists()
