"""HF config / weight-name mapping and HF-directory errors (no transformers needed)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from astrai.errors import CheckpointError, ConfigError, UnsupportedModelError
from astrai.model.checkpoint import save_checkpoint
from astrai.model.hf import load_pretrained, read_config
from astrai.model.hf_export import export_hf
from astrai.model.hf_names import astrai_to_hf_name, hf_to_astrai_name
from astrai.model.hf_config import config_from_hf, config_to_hf

LLAMA = {"model_type": "llama", "vocab_size": 97, "hidden_size": 32, "intermediate_size": 48,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 64, "rms_norm_eps": 1e-6}


def test_llama_fields_map():
    c, notes = config_from_hf({**LLAMA, "tie_word_embeddings": True, "rope_theta": 500.0})
    assert (c.vocab_size, c.dim, c.ffn_dim, c.n_layers, c.n_heads, c.kv_heads, c.hdim) == (
        97, 32, 48, 2, 4, 2, 8)
    assert (c.max_seq_len, c.norm_eps, c.tie_embeddings, c.rope_theta) == (64, 1e-6, True, 500.0)
    assert not c.qkv_bias and c.sliding_window is None and notes == []


def test_transformers_4_and_5_rope_layouts_agree():
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
    v4, _ = config_from_hf(
        {**LLAMA, "rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", **scaling}})
    v4_old, _ = config_from_hf(
        {**LLAMA, "rope_theta": 5e5, "rope_scaling": {"type": "llama3", **scaling}})
    v5, _ = config_from_hf(
        {**LLAMA, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, **scaling}})
    assert v4 == v4_old == v5
    assert v5.rope_theta == 5e5 and v5.rope_scaling.type == "llama3"
    assert v5.rope_scaling.original_max_position_embeddings == 32


def test_yarn_defaults_follow_hf():
    c, _ = config_from_hf({**LLAMA, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}})
    # HF: original_max_position_embeddings defaults to max_position_embeddings
    assert c.rope_scaling.original_max_position_embeddings == 64
    with pytest.raises(UnsupportedModelError, match="truncate"):
        config_from_hf(
            {**LLAMA, "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "truncate": False}})


def test_dynamic_rope_is_plain_rope_with_a_note():
    c, notes = config_from_hf({**LLAMA, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})
    assert c.rope_scaling.type == "none" and "dynamic" in notes[0] and "64" in notes[0]


@pytest.mark.parametrize("hf, match", [
    ({**LLAMA, "model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({**LLAMA, "attention_bias": True}, "attention_bias"),
    ({**LLAMA, "model_type": "qwen3", "attention_bias": True}, "attention_bias"),
    ({**LLAMA, "mlp_bias": True}, "mlp_bias"),
    ({**LLAMA, "hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({**LLAMA, "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({**LLAMA, "rope_scaling": {"rope_type": "longrope", "short_factor": [1]}}, "longrope"),
    ({**LLAMA, "quantization_config": {"quant_method": "gptq"}}, "quantized"),
    ({**LLAMA, "model_type": "qwen2", "use_sliding_window": True, "sliding_window": 8,
      "max_window_layers": 1}, "only some layers"),
])
def test_unsupported_features_are_refused(hf, match):
    with pytest.raises(UnsupportedModelError, match=match):
        config_from_hf(hf, source="x/config.json")


def test_missing_and_inconsistent_fields_are_config_errors():
    with pytest.raises(ConfigError, match="hidden_size"):
        config_from_hf({k: v for k, v in LLAMA.items() if k != "hidden_size"})
    with pytest.raises(ConfigError, match="num_key_value_heads|n_kv_heads"):
        config_from_hf({**LLAMA, "num_key_value_heads": 3})


def test_qwen3_is_qk_norm_without_biases():
    c, _ = config_from_hf({**LLAMA, "model_type": "qwen3", "head_dim": 16,
                           "attention_bias": False})
    assert c.qk_norm and not c.qkv_bias and c.hdim == 16
    assert not config_from_hf({**LLAMA, "model_type": "qwen2"})[0].qk_norm
    assert hf_to_astrai_name("model.layers.3.self_attn.q_norm.weight") == \
        "layers.3.attn.q_norm.weight"
    assert astrai_to_hf_name("layers.0.attn.k_norm.weight") == "model.layers.0.self_attn.k_norm.weight"


def test_sliding_window_rules():
    mistral = {**LLAMA, "model_type": "mistral"}
    assert config_from_hf({**mistral, "sliding_window": 16})[0].sliding_window == 16
    assert config_from_hf({**mistral, "sliding_window": None})[0].sliding_window is None
    qwen = {**LLAMA, "model_type": "qwen2", "sliding_window": 16}
    assert config_from_hf(qwen)[0].sliding_window is None  # use_sliding_window false
    c = config_from_hf({**qwen, "use_sliding_window": True, "max_window_layers": 0})[0]
    assert c.sliding_window == 16 and c.qkv_bias
    all_full = {**qwen, "use_sliding_window": True, "max_window_layers": 2}
    assert config_from_hf(all_full)[0].sliding_window is None


@pytest.mark.parametrize("extra, arch", [
    ({}, "LlamaForCausalLM"),
    ({"qkv_bias": True, "tie_embeddings": True}, "Qwen2ForCausalLM"),
    ({"qkv_bias": True, "sliding_window": 8}, "Qwen2ForCausalLM"),
    ({"sliding_window": 8, "head_dim": 16}, "MistralForCausalLM"),
    ({"qk_norm": True, "head_dim": 16}, "Qwen3ForCausalLM"),
    ({"qk_norm": True, "tie_embeddings": True, "sliding_window": 8}, "Qwen3ForCausalLM"),
    ({"rope_scaling": {"type": "llama3", "factor": 8.0, "original_max_position_embeddings": 16}},
     "LlamaForCausalLM"),
    ({"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                       "attention_factor": 1.2}}, "LlamaForCausalLM"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "LlamaForCausalLM"),
])
def test_export_config_round_trips(extra, arch, make_config):
    c = make_config(**extra)
    hf = config_to_hf(c)
    assert hf["architectures"] == [arch]
    back, _ = config_from_hf(json.loads(json.dumps(hf)))
    assert back == c


def test_moe_export_is_refused(make_config):
    with pytest.raises(UnsupportedModelError, match="mixture-of-experts"):
        config_to_hf(make_config(n_experts=4))


def test_weight_names_round_trip(make_config, make_model):
    model = make_model(make_config(qkv_bias=True))
    for name in model.state_dict():
        hf = astrai_to_hf_name(name)
        assert hf.startswith(("model.", "lm_head")) and hf_to_astrai_name(hf) == name
    assert astrai_to_hf_name("layers.3.attn.q_proj.bias") == "model.layers.3.self_attn.q_proj.bias"
    hf_norm = "model.layers.0.post_attention_layernorm.weight"
    assert hf_to_astrai_name(hf_norm) == "layers.0.mlp_norm.weight"
    assert hf_to_astrai_name("model.layers.0.self_attn.rotary_emb.inv_freq") is None
    with pytest.raises(UnsupportedModelError):
        astrai_to_hf_name("layers.0.mlp.router.weight")


@pytest.fixture
def hf_dir(tmp_path, make_config, make_model):
    """A HF-format directory written by astrai's own exporter (no transformers needed)."""
    c = make_config(qkv_bias=True)
    model = make_model(c)
    ck = save_checkpoint(tmp_path / "ck", model, c)
    return export_hf(ck, tmp_path / "hf"), model


def test_load_hf_dir_and_its_shards(hf_dir, tmp_path):
    path, model = hf_dir
    ids = torch.randint(0, 97, (1, 6))
    loaded, _config, info = load_pretrained(path)
    assert info["format"] == "hf" and info["model_type"] == "qwen2"
    with torch.no_grad():
        want = model(ids).logits
        torch.testing.assert_close(loaded(ids).logits, want, rtol=0, atol=0)
    # reshard: two files + index, as transformers writes large models
    from safetensors import safe_open
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    names = sorted(state)
    parts = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
             "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for fname, keys in parts.items():
        save_file({k: state[k] for k in keys}, str(path / fname), metadata={"format": "pt"})
    (path / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": {k: f for f, ks in parts.items() for k in ks}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded, _, _ = load_pretrained(path)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, want, rtol=0, atol=0)
    (path / "model-00002-of-00002.safetensors").write_bytes(b"truncated")
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors"):
        load_pretrained(path)
    (path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="shards named in .* missing: model-00002"):
        load_pretrained(path)


def test_hf_dir_errors(hf_dir):
    path, _ = hf_dir
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "model_type": "falcon"}))
    with pytest.raises(UnsupportedModelError, match="'falcon'"):
        load_pretrained(path)
    (path / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 40}))
    shape_msg = r"mis-shaped .*mlp.gate_proj.weight \(48, 32\) \(expected \(40, 32\)\)"
    with pytest.raises(CheckpointError, match=shape_msg):
        load_pretrained(path)
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "model.safetensors").rename(path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pytorch_model.bin.*safetensors"):
        load_pretrained(path)


def test_read_config_detects_the_format(hf_dir, tmp_path):
    path, _ = hf_dir
    assert read_config(path)[1]["format"] == "hf"
    assert read_config(tmp_path / "ck")[1]["format"] == "astrai"


def test_dtype_override_and_max_seq_len(hf_dir, tmp_path):
    path, _ = hf_dir
    for src in (path, tmp_path / "ck"):
        model, config, _ = load_pretrained(src, dtype=torch.bfloat16, max_seq_len=128)
        assert model.embed_tokens.weight.dtype == torch.bfloat16 and config.max_seq_len == 128
        assert model.rope_cos.shape[0] == 128 and model.rope_cos.dtype == torch.float32


def test_export_refuses_to_clobber(hf_dir, tmp_path):
    path, _ = hf_dir
    with pytest.raises(CheckpointError, match="already exists"):
        export_hf(tmp_path / "ck", path)
    with pytest.raises(CheckpointError, match="checkpoint itself"):
        export_hf(tmp_path / "ck", tmp_path / "ck", overwrite=True)
    export_hf(tmp_path / "ck", path, overwrite=True, dtype=torch.bfloat16)
    assert json.loads((path / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_special_token_ids_reach_generation_config(tmp_path, make_config, make_model):
    c = make_config()
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text(json.dumps({
        "added_tokens": [{"id": 3, "content": "<|end|>"}], "model": {"vocab": {"<s>": 1}}}))
    (tok / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|end|>", "bos_token": {"content": "<s>"}, "pad_token": None}))
    ck = save_checkpoint(tmp_path / "ck", make_model(c), c, tokenizer_dir=tok)
    out = export_hf(ck, tmp_path / "hf")
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 3 and gen["bos_token_id"] == 1 and "pad_token_id" not in gen
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == 3
    # copied, with tokenizer.json made authoritative for AutoTokenizer
    src = json.loads((tok / "tokenizer_config.json").read_text())
    assert json.loads((out / "tokenizer_config.json").read_text()) == {
        **src, "tokenizer_class": "PreTrainedTokenizerFast"}
