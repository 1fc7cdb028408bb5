"""`astrai info` and `astrai export` through Typer's CliRunner."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from astrai.model import ModelConfig, build_model, get_preset
from astrai.model.checkpoint import save_checkpoint
from astrai.model.stats import flops_per_token, param_counts
from astrai_cli.main import app

runner = CliRunner()


def one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    return lines[0]


def make_checkpoint(path, tokenizer: bool = False, **overrides):
    config = ModelConfig(**{"vocab_size": 64, "dim": 32, "n_layers": 2, "n_heads": 4,
                            "n_kv_heads": 2, "ffn_dim": 48, "max_seq_len": 32, **overrides})
    model = build_model(config, seed=0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.3 * torch.randn_like(p))
            else:
                p.mul_(5)
    tok_dir = None
    if tokenizer:
        from tokenizers import Tokenizer, models, pre_tokenizers

        tok_dir = path.parent / "tok"
        tok_dir.mkdir()
        vocab = {"<eos>": 0, "<bos>": 1, **{f"w{i}": i + 2 for i in range(62)}}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.add_special_tokens(["<eos>", "<bos>"])
        tok.save(str(tok_dir / "tokenizer.json"))
    save_checkpoint(path, model, config, tokenizer_dir=tok_dir, meta={"step": 5, "epoch": 1})
    return model, config


def test_info_preset_table():
    result = runner.invoke(app, ["info", "tiny"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in ("preset tiny", "Parameters", "7,342,336", "FLOPs/token training", "bf16"):
        assert text in out
    assert "router" not in out  # dense: no MoE rows


def test_info_preset_json_matches_the_library():
    result = runner.invoke(app, ["info", "1.2b", "--json", "--seq-len", "1024"])
    assert result.exit_code == 0
    info = json.loads(result.stdout)
    c = get_preset("1.2b")
    assert info["source"] == {"kind": "preset", "name": "1.2b"}
    assert info["config"]["dim"] == 1536
    assert info["params"]["total"] == param_counts(c).total
    assert info["flops_per_token"]["training"] == flops_per_token(c, 1024)
    assert info["weight_memory_bytes"]["bf16"] == 2 * param_counts(c).total


def test_info_checkpoint(tmp_path):
    make_checkpoint(tmp_path / "ck", n_experts=4, moe_top_k=1)
    info = json.loads(runner.invoke(app, ["info", str(tmp_path / "ck"), "--json"]).stdout)
    assert info["source"]["kind"] == "checkpoint" and info["source"]["format"] == "astrai"
    assert info["source"]["meta"]["step"] == 5
    assert info["params"]["active"] < info["params"]["total"]
    table = runner.invoke(app, ["info", str(tmp_path / "ck")]).stdout
    assert "meta.step" in table and "active per token" in table and "router" in table


def test_info_hf_directory(tmp_path):
    make_checkpoint(tmp_path / "ck", qkv_bias=True)
    assert runner.invoke(app, ["export", str(tmp_path / "ck"), str(tmp_path / "hf")]).exit_code == 0
    info = json.loads(runner.invoke(app, ["info", str(tmp_path / "hf"), "--json"]).stdout)
    assert info["source"]["format"] == "hf" and info["source"]["model_type"] == "qwen2"
    assert info["config"]["qkv_bias"] is True


def test_info_errors(tmp_path):
    assert "'nope'" in one_line_error(runner.invoke(app, ["info", "nope"]))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"dim": 30, "n_heads": 4}))
    msg = one_line_error(runner.invoke(app, ["info", str(tmp_path / "bad")]))
    assert "config.json" in msg and "dim (30)" in msg
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"dim": 32, "n_heads": 4,
                                                              "n_kv_heads": 3}))
    assert "n_kv_heads (3)" in one_line_error(runner.invoke(app, ["info", str(tmp_path / "bad")]))
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    msg = one_line_error(runner.invoke(app, ["info", str(tmp_path / "bad")]))
    assert "model_type 'gpt2' is not supported" in msg
    (tmp_path / "file").write_text("x")
    assert "not a directory" in one_line_error(runner.invoke(app, ["info", str(tmp_path / "file")]))


def test_export_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    model, _ = make_checkpoint(tmp_path / "ck", tokenizer=True, sliding_window=6)
    result = runner.invoke(app, ["export", str(tmp_path / "ck"), str(tmp_path / "hf"),
                                 "--format", "hf"])
    assert result.exit_code == 0, result.output
    assert "config.json" in result.stdout and "model.safetensors" in result.stdout
    out = tmp_path / "hf"
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json"):
        assert (out / name).is_file(), name
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(hf).__name__ == "MistralForCausalLM"
    ids = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok("w0 w5 <bos>")["input_ids"] == [2, 7, 1]


def test_export_chat_model_stops_at_end_of_turn(tmp_path):
    """generation_config.json lists the template's end-of-turn token beside eos, so HF
    generate stops where astrai chat stops."""
    transformers = pytest.importorskip("transformers")
    from astrai.data.testing import tiny_tokenizer
    from astrai.model import ModelConfig, build_model
    from astrai.model.checkpoint import save_checkpoint

    tok = tiny_tokenizer(tmp_path)
    cfg = ModelConfig(vocab_size=tok.vocab_size, dim=32, n_layers=1, n_heads=2, n_kv_heads=1,
                      ffn_dim=64, max_seq_len=64)
    save_checkpoint(tmp_path / "ck", build_model(cfg, seed=0), cfg, tokenizer_dir=tok.path)
    r = runner.invoke(app, ["export", str(tmp_path / "ck"), str(tmp_path / "hf")])
    assert r.exit_code == 0, r.output
    # off a terminal the message is one line, however long its paths (not wrapped at 80)
    assert len(r.stdout.splitlines()) == 1 and r.stdout.startswith("exported "), r.stdout
    gen = transformers.GenerationConfig.from_pretrained(tmp_path / "hf")
    end_of_turn = tok.encode("<|im_end|>")
    assert len(end_of_turn) == 1 and end_of_turn[0] in gen.eos_token_id
    assert gen.eos_token_id == tok.stop_ids


def test_export_dtype_and_overwrite(tmp_path):
    make_checkpoint(tmp_path / "ck", tie_embeddings=True)
    args = ["export", str(tmp_path / "ck"), str(tmp_path / "hf")]
    assert runner.invoke(app, args).exit_code == 0
    assert "already exists" in one_line_error(runner.invoke(app, args))
    assert runner.invoke(app, [*args, "--overwrite", "--dtype", "bfloat16"]).exit_code == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16
    assert "lm_head.weight" not in keys  # tied: HF re-ties on load



def test_export_overwrite_replaces_only_an_earlier_export(tmp_path):
    make_checkpoint(tmp_path / "ck")
    home = tmp_path / "home"  # a user's directory named as OUT_DIR by mistake
    (home / ".ssh").mkdir(parents=True)
    (home / "thesis.tex").write_text("keep")
    (home / ".ssh" / "id_ed25519").write_text("keep")
    (tmp_path / "notes.txt").write_text("keep")
    for target, needle in ((home, "a directory without .astrai-export"),
                           (tmp_path / "notes.txt", "a file, not an earlier astrai export")):
        msg = one_line_error(runner.invoke(app, ["export", str(tmp_path / "ck"), str(target),
                                                 "--overwrite"]))
        assert needle in msg
    assert (home / "thesis.tex").read_text() == (home / ".ssh" / "id_ed25519").read_text()
    assert (tmp_path / "notes.txt").read_text() == "keep"
    # an earlier export is replaced; one a user put a file into is refused, the file named
    args = ["export", str(tmp_path / "ck"), str(tmp_path / "hf"), "--overwrite"]
    assert runner.invoke(app, args).exit_code == 0
    marker = json.loads((tmp_path / "hf" / ".astrai-export").read_text())
    assert "model.safetensors" in marker["files"] and "config.json" in marker["files"]
    assert runner.invoke(app, args).exit_code == 0
    (tmp_path / "hf" / "README.md").write_text("mine")
    assert "holds README.md" in one_line_error(runner.invoke(app, args))
    assert (tmp_path / "hf" / "README.md").read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_export_to_an_uncreatable_path_is_one_line(tmp_path):
    make_checkpoint(tmp_path / "ck")
    (tmp_path / "afile").write_text("x")
    for out in ("/proc/astrai-export-test", str(tmp_path / "afile" / "hf")):
        msg = one_line_error(runner.invoke(app, ["export", str(tmp_path / "ck"), out]))
        assert "cannot create it" in msg


def test_a_directory_that_is_no_checkpoint_says_what_was_expected(tmp_path):
    (tmp_path / "notes").mkdir()
    for cmd, extra in (("info", "a preset (tiny, small, 125m, 1.2b)"), ("export", "")):
        args = [cmd, str(tmp_path / "notes")] + ([str(tmp_path / "o")] if cmd == "export" else [])
        msg = one_line_error(runner.invoke(app, args))
        assert "notes: not a checkpoint (no config.json); expected " in msg
        assert "an astrai checkpoint (config.json + model.safetensors" in msg and extra in msg
        assert "Hugging Face model directory" in msg

def test_export_errors(tmp_path):
    make_checkpoint(tmp_path / "moe", n_experts=2, moe_top_k=1)
    out = str(tmp_path / "o")
    msg = one_line_error(runner.invoke(app, ["export", str(tmp_path / "moe"), out]))
    assert "mixture-of-experts" in msg and not (tmp_path / "o").exists()
    msg = one_line_error(runner.invoke(app, ["export", str(tmp_path / "none"), out]))
    assert "not a directory" in msg
    make_checkpoint(tmp_path / "half")
    (tmp_path / "half" / "model.safetensors").unlink()
    msg = one_line_error(runner.invoke(app, ["export", str(tmp_path / "half"), out]))
    assert "missing model.safetensors" in msg
    result = runner.invoke(app, ["export", str(tmp_path / "moe"), str(tmp_path / "o"),
                                 "--format", "onnx"])
    assert result.exit_code == 2 and "onnx" in result.output
