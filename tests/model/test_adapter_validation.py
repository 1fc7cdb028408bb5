"""A PEFT adapter directory is checked whole before anything uses it
(astrai.model.adapter): every value of adapter_config.json of the wrong type or out of
range, an unreadable or absurd file, a path no file system takes and a tensor holding NaN
or Inf is one CheckpointError line naming the file and the key — never a traceback,
never a silent rounding (`r: 8.7` is not rank 8), never a zero rank that divides by zero
later."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from astrai.errors import CheckpointError
from astrai.model.adapter import load_adapter, read_adapter_spec, write_adapter
from astrai.model.lora import LoraSpec, apply_lora

from .conftest import random_model, small_config


@pytest.fixture
def adapter(tmp_path):
    """A valid rank-2 adapter of a small model (q_proj, v_proj)."""
    model = random_model(small_config())
    spec = LoraSpec.build(2, alpha=4.0, targets=["q_proj", "v_proj"])
    apply_lora(model, spec, seed=0)
    return write_adapter(tmp_path / "a", model, spec, None)


def set_config(path, **values) -> None:
    conf_file = path / "adapter_config.json"
    conf_file.write_text(json.dumps({**json.loads(conf_file.read_text()), **values}))


def refused(path, *words: str) -> str:
    with pytest.raises(CheckpointError) as e:
        read_adapter_spec(path)
    message = str(e.value)
    assert "\n" not in message and len(message) < 400, message
    for w in words:
        assert w in message, message
    return message


@pytest.mark.parametrize("key,value", [
    ("r", "abc"), ("r", None), ("r", [8]), ("r", 8.7), ("r", 0), ("r", -4), ("r", True),
    ("r", {"a": 1}), ("lora_alpha", "x"), ("lora_alpha", None), ("lora_alpha", [1]),
    ("lora_alpha", float("nan")), ("lora_alpha", float("inf")), ("lora_alpha", -float("inf")),
    ("lora_dropout", 1.5), ("lora_dropout", "0.1"), ("use_rslora", "yes"),
    ("target_modules", 5), ("target_modules", [5]), ("target_modules", {"q_proj": 1}),
    ("target_modules", []), ("target_modules", ".*q_proj"),
])
def test_a_bad_config_value_is_one_line_naming_the_key(adapter, key, value):
    set_config(adapter, **{key: value})
    refused(adapter, "adapter_config.json", f"{key}:")


def test_a_fractional_rank_is_refused_not_rounded(adapter):
    set_config(adapter, r=2.5)
    refused(adapter, "r: 2.5")
    set_config(adapter, r=2.0)  # a whole number written as a float is that number
    assert read_adapter_spec(adapter).rank == 2


def test_json_nan_and_infinity_alpha_are_refused(adapter):
    conf_file = adapter / "adapter_config.json"
    for token in ("NaN", "Infinity", "-Infinity"):
        text = json.dumps({**json.loads(conf_file.read_text()), "lora_alpha": 0})
        conf_file.write_text(text.replace('"lora_alpha": 0', f'"lora_alpha": {token}'))
        refused(adapter, "lora_alpha:")


def test_unreadable_absurd_and_deep_files_are_one_line(adapter):
    conf_file = adapter / "adapter_config.json"
    conf_file.write_bytes(b'{"r": "\xff\xfe", "target_modules": ["q_proj"]}')
    refused(adapter, "adapter_config.json", "unreadable")
    conf_file.write_text('{"r": ' + "[" * 100_000 + "]" * 100_000 + "}")
    refused(adapter, "adapter_config.json", "nested too deeply")
    conf_file.write_text('{"r": ' + "[" * 500 + "]" * 500 + "}")  # parses: a bounded repr
    refused(adapter, "r:")
    conf_file.write_text("[1, 2]")
    refused(adapter, "expected a JSON object")


@pytest.mark.parametrize("path", ["a" * 100_000, "/tmp/" + "b" * 300])
def test_a_path_no_file_system_takes_is_one_line(path):
    message = refused(path)
    assert len(message) < 300


def test_a_zero_rank_adapter_with_empty_tensors_is_refused(adapter):
    """r = 0 with zero-size tensors matches its own shapes: the rank itself is refused."""
    weights = adapter / "adapter_model.safetensors"
    state = load_file(weights)
    save_file({k: (v[:0] if ".lora_A." in k else v[:, :0]).contiguous()
               for k, v in state.items()}, weights)
    set_config(adapter, r=0)
    refused(adapter, "r: 0")
    with pytest.raises(CheckpointError, match="r: 0"):
        load_adapter(random_model(small_config()), adapter)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_tensor_is_refused_at_load(adapter, bad):
    weights = adapter / "adapter_model.safetensors"
    state = load_file(weights)
    key = min(k for k in state if ".lora_B." in k)
    state[key][1, 0] = bad
    save_file(state, weights)
    with pytest.raises(CheckpointError, match="holds NaN or Inf") as e:
        load_adapter(random_model(small_config()), adapter)
    assert key in str(e.value) and "\n" not in str(e.value)


def test_an_integer_tensor_is_refused(adapter):
    weights = adapter / "adapter_model.safetensors"
    state = load_file(weights)
    key = min(state)
    state[key] = torch.ones_like(state[key], dtype=torch.int32)
    save_file(state, weights)
    with pytest.raises(CheckpointError, match="floating point"):
        load_adapter(random_model(small_config()), adapter)
