"""TrainConfig: precedence defaults < --config file < flags; clear errors."""

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
    import json

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
