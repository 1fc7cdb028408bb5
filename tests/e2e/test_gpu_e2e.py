"""scripts/gpu_e2e.sh (the training / decode / chat figures of a lent GPU): its dry run on the
CPU writes every figure as a number, and the arithmetic it divides by is the datasheet's."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from astrai.model import build_model, get_preset
from astrai.train.flops import DEVICE_SPECS, device_spec

ROOT = Path(__file__).resolve().parents[2]
TRAIN_KEYS = {"preset", "params", "precision", "compile", "activation_checkpointing",
              "fused_adamw", "seq_len", "batch", "steps", "timed_steps", "step_s",
              "compile_warmup_s", "tokens_per_s", "achieved_tflops", "mfu", "peak_memory_gib",
              "final_loss"}
DECODE_KEYS = {"batch", "prompt_len", "new_tokens", "backend", "generated", "decode_steps",
               "decode_s", "tokens_per_s", "ms_per_step", "bytes_per_step", "hbm_gbs",
               "hbm_fraction"}
NUMBERS_TRAIN = {"params", "seq_len", "batch", "steps", "timed_steps", "step_s",
                 "compile_warmup_s", "tokens_per_s", "achieved_tflops", "mfu",
                 "peak_memory_gib", "final_loss"}
NUMBERS_DECODE = DECODE_KEYS - {"backend"}


def _module():
    spec = importlib.util.spec_from_file_location("gpu_e2e", ROOT / "benchmarks" / "gpu_e2e.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@pytest.mark.parametrize("name, spec, tflops, gbs", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.5, 3350.0),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.5, 2000.0),
    ("NVIDIA H100 NVL", "H100 NVL", 835.0, 3900.0),
    ("NVIDIA H200", "H200 SXM", 989.5, 4800.0),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB", 312.0, 2039.0),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB", 312.0, 1555.0),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB", 312.0, 1935.0),
])
def test_device_spec_by_torch_device_name(name, spec, tflops, gbs):
    s = device_spec(name)
    assert (s.name, s.bf16_tflops, s.hbm_gbs) == (spec, tflops, gbs)
    assert "datasheet" in s.source


def test_device_spec_unknown_and_order():
    assert device_spec("NVIDIA GeForce RTX 4090") is None
    assert device_spec("cpu") is None
    # a plain key listed before a longer one containing it would shadow it
    keys = [k for k, _ in DEVICE_SPECS]
    for i, k in enumerate(keys):
        assert not any(k.lower() in later.lower() for later in keys[i + 1:]), k


@pytest.mark.parametrize("tied", [False, True])
def test_decode_bytes_per_step_counts_weights_once_and_kv(tied):
    mod = _module()
    cfg = get_preset("tiny", vocab_size=64, tie_embeddings=tied)
    model = build_model(cfg, seed=0).to(torch.bfloat16)
    # naive: every tensor but the (untied) embedding table, 2 bytes each, + KV of 3 x 10 tokens
    weights = sum(2 * p.numel() for n, p in model.named_parameters()
                  if tied or not n.startswith("embed_tokens"))
    kv = 2 * cfg.n_layers * cfg.kv_heads * cfg.hdim * 2
    assert mod.decode_bytes_per_step(model, 3, 10, kv) == weights + 3 * 10 * kv


def test_ckpt_steps_fit_the_time_left():
    ckpt_steps = _module().ckpt_steps
    # setup 20 s (x1.5 = 30 s), step 0.5 s (x1.4 = 0.7 s): 100 s leave room for 100 steps
    assert ckpt_steps(100, 20, 0.5, 30, 5) == 30
    assert ckpt_steps(37, 20, 0.5, 30, 5) == 10  # (37 - 30) / 0.7 = 10 steps
    assert ckpt_steps(35, 20, 0.5, 30, 5) == 0  # 7 steps < warmup + 3


@pytest.mark.slow
def test_dry_run_writes_every_figure(tmp_path):
    env = {**os.environ, "GPU_E2E_DRY": "1", "OUT": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PYTHON": sys.executable, "GPU_E2E_BUDGET": "600"}
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_e2e.sh")], env=env, check=False,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads((tmp_path / "e2e.json").read_text())
    assert out["dry"] is True and out["device_name"] == "cpu" and out["skipped"] == []
    assert _number(out["peak_bf16_tflops"]) and out["peak_bf16_tflops"] > 0
    assert _number(out["peak_hbm_gbs"]) and out["peak_hbm_gbs"] > 0
    assert out["targets"] == {"mfu": 0.55, "decode_hbm_fraction_batch1": 0.8}
    for key, ckpt in (("train", False), ("train_ckpt", True)):
        t = out[key]
        assert set(t) == TRAIN_KEYS
        assert all(_number(t[k]) for k in NUMBERS_TRAIN), t
        assert t["activation_checkpointing"] is ckpt and t["fused_adamw"] is True
        assert t["steps"] == 3 and t["timed_steps"] == 2 and 0 < t["mfu"]
        assert math.isclose(t["tokens_per_s"], t["batch"] * t["seq_len"] / t["step_s"])
    for b in (1, 32):
        d = out[f"decode_b{b}"]
        assert set(d) == DECODE_KEYS and d["batch"] == b
        assert all(_number(d[k]) for k in NUMBERS_DECODE), d
        assert d["generated"] == b * d["new_tokens"] and d["hbm_gbs"] > 0
    chat = out["chat"]
    assert chat["equal"] is True, chat
    assert chat["exit_codes"] == {"torch_native": 0, "auto": 0}
    assert chat["replies"]["torch_native"].strip()
    for line in ("train tiny", "decode batch 1", "decode batch 32", "chat --prompt"):
        assert line in res.stdout
