"""Equal logits with HF transformers: HF Llama / Qwen2 / Qwen3 / Mistral → astrai (loaded in a process
where transformers cannot be imported), and astrai → `export_hf` → transformers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file, save_file

from astrai.model.checkpoint import save_checkpoint
from astrai.model.hf import load_pretrained
from astrai.model.hf_export import export_hf

transformers = pytest.importorskip("transformers")

B, T, V = 2, 12, 128
TOL = {"rtol": 1e-4, "atol": 1e-4}
COMMON = {"vocab_size": V, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
HF_CASES = {
    # GQA, untied, Llama 3.1 RoPE scaling, sharded with an index file
    "llama": ("LlamaConfig", {"rope_theta": 500.0, "rope_scaling": {
        "rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}}),
    # q/k/v biases, tied embeddings, YaRN
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": True, "rope_scaling": {
        "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32}}),
    # sliding window (5) shorter than the sequence (12), head_dim != hidden / heads
    "mistral": ("MistralConfig", {"sliding_window": 5, "head_dim": 24}),
    # QK-norm (random gains), explicit head_dim != hidden / heads, tied embeddings
    "qwen3": ("Qwen3Config", {"head_dim": 24, "tie_word_embeddings": True}),
}

LOADER = textwrap.dedent("""
    import json, sys
    sys.modules["transformers"] = None  # any import of transformers now raises ImportError
    sys.modules["huggingface_hub"] = None
    from safetensors.torch import load_file, save_file
    from astrai.model.hf import load_pretrained
    dirs, ids_file, out_file = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    ids = load_file(ids_file)["ids"]
    out = {}
    for name, path in dirs.items():
        model, config, info = load_pretrained(path)
        assert info["format"] == "hf", info
        out[name] = model(ids).logits.detach().contiguous()
    save_file(out, out_file)
""")


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Random weights, biases and non-trivial norm gains (1 + noise)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.3 * noise if name.endswith("norm.weight") else 0.1 * noise)


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(0))
    dirs, logits = {}, {}
    for i, (name, (cls, extra)) in enumerate(HF_CASES.items()):
        config = getattr(transformers, cls)(**COMMON, **extra)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        randomize(model, i)
        path = root / name
        model.save_pretrained(path, max_shard_size="40KB" if name == "llama" else "1GB")
        with torch.no_grad():
            logits[name] = model(ids).logits
        dirs[name] = str(path)
    assert (root / "llama" / "model.safetensors.index.json").is_file()
    assert (root / "qwen2" / "model.safetensors").is_file()
    save_file({"ids": ids}, str(root / "ids.safetensors"))
    subprocess.run(
        [sys.executable, "-c", LOADER, json.dumps(dirs), str(root / "ids.safetensors"),
         str(root / "ours.safetensors")], check=True, timeout=300,
    )
    return ids, dirs, logits, load_file(str(root / "ours.safetensors"))


@pytest.mark.parametrize("name", list(HF_CASES))
def test_load_pretrained_without_transformers_gives_equal_logits(hf_models, name):
    _, _, theirs, ours = hf_models
    torch.testing.assert_close(ours[name], theirs[name], **TOL)


def test_the_sliding_window_is_what_makes_mistral_match(hf_models):
    ids, dirs, theirs, _ = hf_models
    model, config, _ = load_pretrained(dirs["mistral"])
    assert config.sliding_window == 5 and config.hdim == 24
    model.config = config.model_copy(update={"sliding_window": None})
    with torch.no_grad():
        full = model(ids).logits
    torch.testing.assert_close(full[:, :5], theirs["mistral"][:, :5], **TOL)
    assert (full[:, 5:] - theirs["mistral"][:, 5:]).abs().max() > 1e-3


def test_loading_without_transformers_really_fails_if_imported(tmp_path):
    # Guards the guard: the blocker used above does make `import transformers` fail.
    code = "import sys; sys.modules['transformers'] = None; import transformers"
    blocked = subprocess.run([sys.executable, "-c", code], capture_output=True, check=False)
    assert blocked.returncode != 0 and b"import of transformers halted" in blocked.stderr


EXPORT_CASES = {
    "llama-ntk": {"rope_scaling": {"type": "ntk", "factor": 4.0}},
    "qwen2-tied-window": {"qkv_bias": True, "tie_embeddings": True, "sliding_window": 4,
                              "rope_scaling": {"type": "yarn", "factor": 2.0,
                                            "original_max_position_embeddings": 16}},
    "mistral-linear": {"sliding_window": 5, "head_dim": 16,
                       "rope_scaling": {"type": "linear", "factor": 2.0}},
    "qwen3-qknorm": {"qk_norm": True, "head_dim": 24},
    "qwen3-qknorm-tied-window": {"qk_norm": True, "tie_embeddings": True, "sliding_window": 4},
}
ARCH = {"llama-ntk": "LlamaForCausalLM", "qwen2-tied-window": "Qwen2ForCausalLM",
        "mistral-linear": "MistralForCausalLM", "qwen3-qknorm": "Qwen3ForCausalLM",
        "qwen3-qknorm-tied-window": "Qwen3ForCausalLM"}


@pytest.mark.parametrize("name", list(EXPORT_CASES))
def test_export_loads_in_transformers_with_equal_logits(tmp_path, make_config, make_model, name):
    config = make_config(vocab_size=V, dim=64, ffn_dim=96, **EXPORT_CASES[name])
    model = make_model(config, seed=3)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():  # larger weights than init and uneven gains: every path matters
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(5)
            else:  # norm gains (QK-norm's included)
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    out = export_hf(save_checkpoint(tmp_path / "ck", model, config), tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(hf).__name__ == ARCH[name]
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits, **TOL)


def test_export_refuses_qk_norm_with_qkv_bias_in_one_line(tmp_path, make_config, make_model):
    from astrai.errors import UnsupportedModelError

    config = make_config(vocab_size=V, dim=64, ffn_dim=96, qk_norm=True, qkv_bias=True)
    ckpt = save_checkpoint(tmp_path / "ck", make_model(config, seed=0), config)
    with pytest.raises(UnsupportedModelError, match="qk_norm with qkv_bias") as e:
        export_hf(ckpt, tmp_path / "hf")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "hf").exists()
