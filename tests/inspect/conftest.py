"""Planted checkpoints shared by the inspect tests (built once per session)."""

from __future__ import annotations

import pytest
import torch

from astrai.inspect.testing import (
    Planted,
    fresh_state,
    plant_lockin,
    tiny_config,
    write_checkpoint,
    write_hf_dir,
)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs on one torch thread (tests/conftest.py)."""


@pytest.fixture(scope="session")
def cfg():
    return tiny_config()


@pytest.fixture(scope="session")
def planted_dir(tmp_path_factory, cfg):
    state = plant_lockin(fresh_state(cfg, seed=0), cfg)
    return write_checkpoint(tmp_path_factory.mktemp("ck") / "step_100", state, cfg,
                            meta={"step": 100, "lr": 7.5e-6})


@pytest.fixture(scope="session")
def healthy_dir(tmp_path_factory, cfg):
    return write_checkpoint(tmp_path_factory.mktemp("ck") / "step_0", fresh_state(cfg, seed=0),
                            cfg, meta={"step": 0, "train": {"optimizer": {"lr": 3e-4}}})


@pytest.fixture(scope="session")
def healthy_bf16_dir(tmp_path_factory, cfg):
    return write_checkpoint(tmp_path_factory.mktemp("ck") / "bf16",
                            fresh_state(cfg, seed=1, dtype=torch.bfloat16), cfg)


@pytest.fixture(scope="session")
def planted_hf_dir(tmp_path_factory, cfg):
    state = plant_lockin(fresh_state(cfg, seed=0), cfg)
    return write_hf_dir(tmp_path_factory.mktemp("hf") / "llama", state, cfg, shards=2)


@pytest.fixture(scope="session")
def planted():
    return Planted()
