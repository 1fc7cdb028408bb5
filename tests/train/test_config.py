"""TrainConfig: precedence defaults < --config file < flags; clear errors."""

import json
from pathlib import Path

import pytest

from astrai.config.train import TrainConfig, load_train_config
from astrai.errors import ConfigError


def test_precedence(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("max_lr: 0.001\nbatch_size: 16\nschedule: wsd\n")
    cfg = load_train_config(f, {"batch_size": 2, "max_lr": None})
    assert cfg.batch_size == 2  # flag beats file
    assert cfg.optimizer.max_lr == 0.001  # file beats default (None = flag not given)
    assert cfg.schedule.name == "wsd" and cfg.grad_accum_steps == 1  # default
    assert cfg.optimizer.min_lr_value == pytest.approx(1e-4)


def test_json_config_and_roundtrip(tmp_path):
    cfg = TrainConfig(strategy="sft", batch_size=3)
    f = tmp_path / "t.json"
    f.write_text(json.dumps(cfg.to_dict()))
    assert load_train_config(f) == cfg


def test_unknown_key_names_file_and_line(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("batch_size: 4\n\nlearning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"t\.yaml: line 3: unknown key `learning_rate`"):
        load_train_config(f)


def test_bad_values_name_the_field(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("batch_size: 0\n")
    with pytest.raises(ConfigError, match=r"t\.yaml: batch_size: .*greater than 0"):
        load_train_config(f)
    with pytest.raises(ConfigError, match="schedule"):
        load_train_config(None, {"schedule": "linear"})
    with pytest.raises(ConfigError, match="min_lr"):
        load_train_config(None, {"min_lr": 1.0, "max_lr": 0.1})
    f.write_text("batch_size: [\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_train_config(f)


FLAT_V1 = Path(__file__).parent / "assets" / "flat_train_config_v1.json"
ADDED_SINCE_V1 = {"bf16_update", "guard_visible_warn", "checkpoint_format", "async_checkpoint",
                  "tp"}
"""Fields added after FLAT_V1 was saved (a v1 config loads with their defaults)."""


def test_every_flat_name_of_the_flat_version_is_kept():
    """The flat names (flags, flat config keys) are exactly the fields of the flat
    TrainConfig that saved FLAT_V1, plus the ones added since; each maps to one nested
    field."""
    from astrai.config.section import flat_fields

    flat = flat_fields(TrainConfig)
    assert set(flat) == set(json.loads(FLAT_V1.read_text())) | ADDED_SINCE_V1
    assert len({f.path for f in flat.values()}) == len(flat)


@pytest.mark.parametrize("flat, path, value", [
    ("max_lr", ("optimizer", "max_lr"), 0.5), ("optimizer", ("optimizer", "name"), "muon"),
    ("schedule", ("schedule", "name"), "wsd"), ("lora_rank", ("lora", "rank"), 4),
    ("adapter", ("lora", "adapter"), "a"), ("ckpt_dir", ("checkpoint", "dir"), "c"),
    ("keep_last", ("checkpoint", "keep_last"), 1), ("val_split", ("eval", "val_split"), 0.1),
    ("eval_max_batches", ("eval", "max_batches"), 2), ("precision", ("precision", "mode"), "fp32"),
    ("nprocs", ("runtime", "nprocs"), 2), ("tensorboard", ("logging", "tensorboard"), True),
    ("guard_bf16", ("guard", "bf16"), True), ("beta", ("alignment", "beta"), 0.3),
    ("rollout_top_k", ("alignment", "rollout", "top_k"), 5),
    ("eval_max_tokens", ("alignment", "eval_max_tokens"), 7),
])
def test_flat_names_set_their_nested_field(flat, path, value):
    cfg = load_train_config(None, {flat: value})
    node = cfg
    for part in path:
        node = getattr(node, part)
    assert node == value


def test_nested_and_flat_config_files(tmp_path):
    """A config file may nest by section or use the flat keys, or mix them; flags (flat)
    still beat the file, field by field within a section."""
    f = tmp_path / "t.yaml"
    f.write_text("optimizer:\n  max_lr: 0.003\n  name: muon\nweight_decay: 0.05\n"
                 "alignment:\n  rollout:\n    max_tokens: 9\nschedule: wsd\n")
    cfg = load_train_config(f, {"muon_momentum": 0.9})
    o = cfg.optimizer
    assert (o.max_lr, o.name, o.weight_decay, o.muon_momentum) == (0.003, "muon", 0.05, 0.9)
    assert cfg.alignment.rollout.max_tokens == 9 and cfg.schedule.name == "wsd"
    flat = tmp_path / "flat.yaml"
    flat.write_text("max_lr: 0.003\noptimizer: muon\nweight_decay: 0.05\n"
                    "rollout_max_tokens: 9\nschedule: wsd\n")
    assert load_train_config(flat, {"muon_momentum": 0.9}) == cfg
    # what a run saves is the nested form, and reads back equal
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(cfg.to_dict()))
    assert "max_lr" in cfg.to_dict()["optimizer"] and load_train_config(saved) == cfg


def test_nested_errors_name_the_file_line_and_field(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("batch_size: 4\noptimizer:\n  max_lr: 0.1\n  max_lrr: 0.1\n")
    with pytest.raises(ConfigError, match=r"t\.yaml: line 4: unknown key `optimizer\.max_lrr`"):
        load_train_config(f)
    f.write_text("alignment:\n  rollout:\n    top_kk: 1\n")
    with pytest.raises(ConfigError,
                       match=r"t\.yaml: line 3: unknown key `alignment\.rollout\.top_kk`"):
        load_train_config(f)
    f.write_text("optimizer:\n  max_lr: true\n")
    with pytest.raises(ConfigError, match=r"t\.yaml: optimizer\.max_lr: expected a number"):
        load_train_config(f)
    f.write_text("lora:\n  alpha: 8\n")  # the cross-field checks keep naming the flags
    with pytest.raises(ConfigError, match="lora_alpha: LoRA options need --lora-rank R"):
        load_train_config(f)


def test_saved_option_reads_both_forms():
    from astrai.config.train import saved_option

    nested = TrainConfig(ckpt_dir="/ckpt", optimizer="muon").to_dict()
    flat = json.loads(FLAT_V1.read_text())
    assert saved_option(nested, "ckpt_dir") == "/ckpt" and saved_option(flat, "ckpt_dir") is None
    assert saved_option(nested, "optimizer") == "muon" and saved_option(flat, "optimizer") == "adamw"
    assert saved_option(flat, "ckpt_interval") == 2 and saved_option({}, "max_lr") is None
