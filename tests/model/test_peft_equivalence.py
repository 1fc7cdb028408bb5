"""astrai LoRA against PEFT itself: an adapter astrai wrote loads with
`PeftModel.from_pretrained` on the exported base and gives astrai's logits; an adapter PEFT
made (`get_peft_model`, non-zero B) loads into astrai with equal logits; `--merge-lora`
equals PEFT's `merge_and_unload`."""

from __future__ import annotations

import json

import pytest
import torch

from astrai.model.adapter import load_adapter, write_adapter
from astrai.model.checkpoint import save_checkpoint
from astrai.model.hf import load_pretrained
from astrai.model.hf_export import export_hf
from astrai.model.lora import LoraSpec, apply_lora, lora_layers

from .conftest import random_model, small_config

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

TOL = {"rtol": 1e-5, "atol": 1e-5}


def ids() -> torch.Tensor:
    return torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(3))


def lora_checkpoint(tmp_path, targets=("all-linear",), qkv_bias=False):
    """An astrai checkpoint of a random model whose adapter/ has random A and B."""
    cfg = small_config(qkv_bias=qkv_bias)
    model = random_model(cfg)
    spec = LoraSpec.build(4, alpha=12.0, targets=list(targets))
    apply_lora(model, spec, seed=0)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for _, layer in lora_layers(model):
            layer.lora_B.weight.copy_(0.2 * torch.randn(layer.lora_B.weight.shape, generator=g))
    base = {k: v for k, v in model.state_dict().items() if ".lora_" not in k}
    ckpt = save_checkpoint(tmp_path / "ckpt", base, cfg,
                           write_more=lambda d: write_adapter(d / "adapter", model, spec, "x"))
    return ckpt, model.eval()


@pytest.mark.parametrize("targets,qkv_bias", [(("all-linear",), False),
                                              (("q_proj", "v_proj", "down_proj"), True)])
def test_astrai_adapter_loads_in_peft_with_equal_logits(tmp_path, targets, qkv_bias):
    ckpt, ours = lora_checkpoint(tmp_path, targets, qkv_bias)
    hf_dir = export_hf(ckpt, tmp_path / "hf")
    assert (hf_dir / "adapter" / "adapter_config.json").is_file()  # copied beside the base
    base = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    theirs = peft.PeftModel.from_pretrained(base, ckpt / "adapter").eval()
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(ours(x).logits, theirs(input_ids=x).logits, **TOL)



def test_exported_adapter_names_the_exported_base(tmp_path, monkeypatch):
    """AutoPeftModelForCausalLM reads the base from the adapter's base_model_name_or_path:
    it must be the exported HF directory (absolute: a relative path is a Hub id to PEFT)."""
    ckpt, ours = lora_checkpoint(tmp_path)
    monkeypatch.chdir(tmp_path)
    hf_dir = export_hf(ckpt, "hf")  # a relative OUT_DIR
    conf = json.loads((hf_dir / "adapter" / "adapter_config.json").read_text())
    assert conf["base_model_name_or_path"] == str((tmp_path / "hf").resolve())
    monkeypatch.chdir(ckpt)  # loads from anywhere
    theirs = peft.AutoPeftModelForCausalLM.from_pretrained(
        str(tmp_path / "hf" / "adapter"), dtype=torch.float32).eval()
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(ours(x).logits, theirs(input_ids=x).logits, **TOL)

def test_merge_lora_equals_peft_merge_and_unload(tmp_path):
    ckpt, ours = lora_checkpoint(tmp_path)
    merged_dir = export_hf(ckpt, tmp_path / "merged", merge_lora=True)
    assert not (merged_dir / "adapter").exists()
    ours_merged = transformers.AutoModelForCausalLM.from_pretrained(merged_dir,
                                                                    dtype=torch.float32)
    base = transformers.AutoModelForCausalLM.from_pretrained(export_hf(ckpt, tmp_path / "hf"),
                                                             dtype=torch.float32)
    theirs = peft.PeftModel.from_pretrained(base, ckpt / "adapter").merge_and_unload().eval()
    x = ids()
    with torch.no_grad():
        want = theirs(input_ids=x).logits
        torch.testing.assert_close(ours_merged(input_ids=x).logits, want, **TOL)
        torch.testing.assert_close(ours(x).logits, want, **TOL)


@pytest.mark.parametrize("rslora", [False, True])
def test_peft_adapter_loads_in_astrai_with_equal_logits(tmp_path, rslora):
    hf_cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    hf.save_pretrained(tmp_path / "base")
    cfg = peft.LoraConfig(r=4, lora_alpha=7, lora_dropout=0.1, use_rslora=rslora,
                          target_modules=["q_proj", "k_proj", "o_proj", "up_proj"],
                          task_type="CAUSAL_LM")
    theirs = peft.get_peft_model(hf, cfg)
    with torch.no_grad():  # PEFT inits B = 0: make every adapter count
        for name, p in theirs.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    theirs.save_pretrained(tmp_path / "adapter")
    theirs.eval()
    ours, _, _ = load_pretrained(tmp_path / "base")
    spec = load_adapter(ours, tmp_path / "adapter")
    assert spec.rslora is rslora and spec.dropout == 0.1
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(x).logits, theirs(input_ids=x).logits, **TOL)
