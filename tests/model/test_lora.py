"""LoRA layers (astrai.model.lora) against the closed form y = Wx + b + (alpha/r) B A x, and
the PEFT adapter format (astrai.model.adapter) against its own round trip."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from astrai.errors import CheckpointError, ConfigError
from astrai.model.adapter import load_adapter, read_adapter_spec, write_adapter
from astrai.model.lora import (
    LoRALinear,
    LoraSpec,
    adapters_disabled,
    apply_lora,
    lora_layers,
    lora_state_dict,
    merge_lora,
)

from .conftest import random_model, small_config


def randomize_b(model: nn.Module, seed: int = 1) -> None:
    """Non-zero B everywhere, so every adapter changes the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in lora_layers(model):
            layer.lora_B.weight.copy_(0.1 * torch.randn(layer.lora_B.weight.shape, generator=g))


def ids(n: int = 2, t: int = 10, v: int = 97) -> torch.Tensor:
    return torch.randint(0, v, (n, t), generator=torch.Generator().manual_seed(5))


def test_layer_is_the_closed_form_and_inits_like_peft():
    base = nn.Linear(12, 20, bias=True)
    w, b = base.weight.detach().clone(), base.bias.detach().clone()
    layer = LoRALinear(base, LoraSpec(rank=4, alpha=6.0), torch.Generator().manual_seed(0))
    assert layer.weight is base.weight and not layer.weight.requires_grad
    assert torch.count_nonzero(layer.lora_B.weight) == 0
    # kaiming_uniform(a=√5) on [r, in] is U(-1/√in, 1/√in), nn.Linear's default
    bound = 1 / math.sqrt(12)
    assert layer.lora_A.weight.abs().max() <= bound and layer.lora_A.weight.std() > bound / 4
    torch.nn.init.normal_(layer.lora_B.weight)
    x = torch.randn(3, 5, 12)
    want = x @ w.T + b + 1.5 * (x @ layer.lora_A.weight.T @ layer.lora_B.weight.T)
    torch.testing.assert_close(layer(x), want)
    layer.enabled = False
    torch.testing.assert_close(layer(x), x @ w.T + b)


def test_layer_gradients_are_the_closed_forms():
    """The fused update (out += s·(xA)Bᵀ in place) differentiates like y = xWᵀ + b + s·xAᵀBᵀ
    written out: grads of A, B and x, none for the frozen W and b, on a non-contiguous
    3-D input."""
    base = nn.Linear(12, 20, bias=True)
    layer = LoRALinear(base, LoraSpec(rank=4, alpha=6.0), torch.Generator().manual_seed(0))
    torch.nn.init.normal_(layer.lora_B.weight)
    x = torch.randn(5, 3, 12).transpose(0, 1).requires_grad_()  # (3, 5, 12), not contiguous
    g = torch.randn(3, 5, 20)
    layer(x).backward(g)
    got = [x.grad, layer.lora_A.weight.grad, layer.lora_B.weight.grad]
    assert layer.weight.grad is None and layer.bias.grad is None
    w, b = base.weight.detach(), base.bias.detach()
    a = layer.lora_A.weight.detach().clone().requires_grad_()
    bm = layer.lora_B.weight.detach().clone().requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    (x2 @ w.T + b + 1.5 * (x2 @ a.T @ bm.T)).backward(g)
    for have, want in zip(got, [x2.grad, a.grad, bm.grad], strict=True):
        torch.testing.assert_close(have, want)


def test_dropout_only_on_the_adapter_input_in_training():
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(8, 8, bias=False), LoraSpec(rank=2, alpha=2.0, dropout=0.5))
    torch.nn.init.normal_(layer.lora_B.weight)
    x = torch.randn(4, 8)
    layer.train()
    torch.manual_seed(1)
    y = layer(x)
    torch.manual_seed(1)
    mask = torch.nn.functional.dropout(torch.ones_like(x), 0.5, True)
    want = x @ layer.weight.T + (x * mask) @ layer.lora_A.weight.T @ layer.lora_B.weight.T
    torch.testing.assert_close(y, want)
    layer.eval()
    torch.testing.assert_close(layer(x), x @ (layer.weight + layer.delta()).T)


def test_apply_freezes_base_and_fresh_adapters_change_nothing():
    model = random_model(small_config())
    x = ids()
    before = model(x).logits
    apply_lora(model, LoraSpec.build(4, targets=["q_proj,v_proj", "down_proj"]), seed=0)
    names = [n for n, _ in lora_layers(model)]
    assert names == [f"layers.{i}.{m}" for i in range(2)
                     for m in ("attn.q_proj", "attn.v_proj", "mlp.down_proj")]
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    torch.testing.assert_close(model(x).logits, before)  # B = 0


def test_adapters_stay_fp32_with_a_bf16_base_and_merge_equals_lora():
    model = random_model(small_config())
    apply_lora(model, LoraSpec.build(4), seed=0)
    randomize_b(model)
    x = ids()
    lora = model(x).logits
    with adapters_disabled(model):
        base = model(x).logits
    assert not torch.allclose(lora, base)
    model.to(torch.bfloat16)
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if ".lora_" in n)
    assert model.layers[0].attn.q_proj.weight.dtype == torch.bfloat16
    model.float()  # the base rounded to bf16 and back: compare from here
    lora = model(x).logits
    merged = merge_lora(model)
    assert not any(True for _ in lora_layers(merged))
    torch.testing.assert_close(merged(x).logits, lora, rtol=1e-5, atol=1e-5)


def test_peft_format_round_trip(tmp_path):
    cfg = small_config()
    model = random_model(cfg)
    spec = LoraSpec.build(3, alpha=5.0, dropout=0.1, targets=["all-linear"])
    apply_lora(model, spec, seed=0)
    randomize_b(model)
    write_adapter(tmp_path / "a", model, spec, "base-dir")
    conf = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert conf["peft_type"] == "LORA" and conf["task_type"] == "CAUSAL_LM"
    assert (conf["r"], conf["lora_alpha"], conf["lora_dropout"]) == (3, 5.0, 0.1)
    assert conf["base_model_name_or_path"] == "base-dir"
    from safetensors import safe_open

    with safe_open(tmp_path / "a" / "adapter_model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys
    assert "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight" in keys
    assert read_adapter_spec(tmp_path / "a") == spec
    other = random_model(cfg)
    load_adapter(other, tmp_path / "a")
    for k, v in lora_state_dict(model).items():
        torch.testing.assert_close(lora_state_dict(other)[k], v, rtol=0, atol=0)


def test_bad_adapters_are_one_line_errors(tmp_path):
    cfg = small_config()
    model = random_model(cfg)
    spec = LoraSpec.build(2, targets=["q_proj"])
    apply_lora(model, spec, seed=0)
    write_adapter(tmp_path / "a", model, spec, None)
    conf_file = tmp_path / "a" / "adapter_config.json"
    conf = json.loads(conf_file.read_text())
    with pytest.raises(CheckpointError, match="no adapter_config.json"):
        read_adapter_spec(tmp_path)
    conf_file.write_text(json.dumps({**conf, "use_dora": True}))
    with pytest.raises(CheckpointError, match="use_dora"):
        read_adapter_spec(tmp_path / "a")
    conf_file.write_text(json.dumps({**conf, "target_modules": ["q_proj", "v_proj"]}))
    with pytest.raises(CheckpointError, match="missing: layers.0.attn.v_proj"):
        load_adapter(random_model(cfg), tmp_path / "a")
    conf_file.write_text(json.dumps({**conf, "target_modules": ["lm_head"]}))
    with pytest.raises(CheckpointError, match="lm_head is not a LoRA target"):
        read_adapter_spec(tmp_path / "a")
    with pytest.raises(ConfigError, match="mixture-of-experts"):
        apply_lora(random_model(small_config(n_experts=4)), spec)
