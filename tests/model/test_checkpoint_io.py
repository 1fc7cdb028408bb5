"""Checkpoint directory: bit-exact round trip, tied weights once, atomic writes, clear errors."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from astrai.errors import CheckpointError, ConfigError
from astrai.model.checkpoint import (
    load_checkpoint,
    load_extra,
    read_meta,
    save_checkpoint,
)


@pytest.mark.parametrize("extra", [
    {}, {"tie_embeddings": True, "qkv_bias": True},
    {"n_experts": 3, "moe_top_k": 2, "n_shared_experts": 1, "moe_layers": [1]},
])
def test_round_trip_is_bit_exact(tmp_path, make_config, make_model, extra):
    config = make_config(**extra)
    model = make_model(config)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randint(0, 97, (1, 4))).logits.sum().backward()
    opt.step()
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text('{"fake": true}')
    path = save_checkpoint(tmp_path / "ck", model, config, tokenizer_dir=tmp_path / "tok",
                           meta={"step": 7}, extras={"optimizer": opt.state_dict()})
    loaded, config2, meta = load_checkpoint(path)
    assert config2 == config and meta["step"] == 7 and "version" in meta
    assert read_meta(path)["step"] == 7
    saved, got = model.state_dict(), loaded.state_dict()
    assert saved.keys() == got.keys()
    for k in saved:
        assert torch.equal(saved[k], got[k]) and saved[k].dtype == got[k].dtype, k
    ids = torch.randint(0, 97, (2, 6))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert (path / "tokenizer.json").read_text() == '{"fake": true}'
    opt_state = load_extra(path, "optimizer")
    assert torch.equal(opt_state["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    assert load_extra(path, "scheduler") is None


def test_tied_embeddings_are_stored_once(tmp_path, make_config, make_model):
    config = make_config(tie_embeddings=True)
    path = save_checkpoint(tmp_path / "ck", make_model(config), config)
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
    assert "embed_tokens.weight" in keys and not any(k.startswith("lm_head") for k in keys)
    loaded, _, _ = load_checkpoint(path)
    assert loaded.output_weight() is loaded.embed_tokens.weight


def test_bf16_round_trip_keeps_dtype(tmp_path, make_config, make_model):
    config = make_config()
    model = make_model(config).to(torch.bfloat16)
    loaded, _, _ = load_checkpoint(save_checkpoint(tmp_path / "ck", model, config))
    assert loaded.embed_tokens.weight.dtype == torch.bfloat16
    assert loaded.rope_cos.dtype == torch.float32  # RoPE tables stay fp32
    assert torch.equal(loaded.embed_tokens.weight, model.embed_tokens.weight)


def test_failed_save_leaves_nothing_behind(tmp_path, make_config, make_model):
    config = make_config()
    with pytest.raises((pickle.PicklingError, AttributeError)):  # by Python version
        save_checkpoint(tmp_path / "ck", make_model(config), config,
                        extras={"optimizer": lambda: None})  # not picklable
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def checkpoint(tmp_path, make_config, make_model):
    config = make_config()
    return save_checkpoint(tmp_path / "ck", make_model(config), config)


def test_missing_directory_and_files(tmp_path, checkpoint):
    with pytest.raises(CheckpointError, match="not a directory"):
        load_checkpoint(tmp_path / "nope")
    (checkpoint / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing model.safetensors"):
        load_checkpoint(checkpoint)


def test_corrupt_safetensors(checkpoint):
    (checkpoint / "model.safetensors").write_bytes(b"\x00garbage" * 100)
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_checkpoint(checkpoint)


def test_truncated_safetensors(checkpoint):
    f = checkpoint / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(checkpoint)


def test_missing_unexpected_and_misshaped_tensors_are_listed(checkpoint):
    f = checkpoint / "model.safetensors"
    with safe_open(str(f), framework="pt") as fh:
        state = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
    del state["layers.1.mlp.up_proj.weight"]
    state["layers.0.attn.q_proj.weight"] = torch.zeros(3, 3)
    state["extra.weight"] = torch.zeros(1)
    save_file(state, str(f))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(checkpoint)
    msg = str(e.value)
    assert "missing layers.1.mlp.up_proj.weight" in msg
    assert "unexpected extra.weight" in msg
    assert "mis-shaped layers.0.attn.q_proj.weight (3, 3) (expected (32, 32))" in msg
    assert "\n" not in msg


def test_bad_config_json(checkpoint):
    (checkpoint / "config.json").write_text('{"dim": 32,\n "n_heads": }')
    with pytest.raises(CheckpointError, match="line 2"):
        load_checkpoint(checkpoint)
    (checkpoint / "config.json").write_text(json.dumps({"dim": 30, "n_heads": 4}))
    with pytest.raises(ConfigError, match="config.json.*dim \\(30\\)"):
        load_checkpoint(checkpoint)


def test_a_run_directory_stands_for_its_newest_checkpoint(tmp_path, make_config, make_model):
    from astrai.model.checkpoint import resolve_checkpoint

    cfg = make_config()
    model = make_model(cfg)
    run = tmp_path / "run"
    for step in (2, 10):  # numeric order: step_10 is newer than step_2
        save_checkpoint(run / "checkpoints" / f"step_{step}", model, cfg)
    (run / "checkpoints" / "step_11").mkdir()  # incomplete: no weights
    path, note = resolve_checkpoint(run)
    assert path == run / "checkpoints" / "step_10"
    assert note == f"{run} is a run directory: using its newest checkpoint {path}"
    assert resolve_checkpoint(path) == (path, None)  # a checkpoint is itself
    assert resolve_checkpoint(tmp_path / "nope") == (tmp_path / "nope", None)
    empty = tmp_path / "empty-run"
    (empty / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="run directory with no complete checkpoint"):
        resolve_checkpoint(empty)
