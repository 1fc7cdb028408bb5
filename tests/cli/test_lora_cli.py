"""`--adapter DIR` for chat, serve, serve-bench, inspect-weights, and
`astrai export --merge-lora`: the adapter is merged into the weights, a LoRA run's checkpoint
uses its own adapter/, and a bad adapter is a one-line error (exit 2)."""

import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from astrai.data.testing import tiny_tokenizer
from astrai.infer import CacheConfig, Engine, SamplingParams
from astrai.infer.loading import load_model
from astrai.model import ModelConfig, build_model
from astrai.model.adapter import write_adapter
from astrai.model.checkpoint import save_checkpoint
from astrai.model.hf import load_pretrained
from astrai.model.lora import LoraSpec, apply_lora, lora_layers, merge_lora
from astrai_cli.main import app

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A base checkpoint, an adapter with non-zero B beside it, and a LoRA checkpoint
    (base + adapter/ inside, as a LoRA training run writes)."""
    root = tmp_path_factory.mktemp("lora")
    tok = tiny_tokenizer(root)
    cfg = ModelConfig(vocab_size=tok.vocab_size, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                      ffn_dim=128, max_seq_len=256)
    model = build_model(cfg, seed=0)
    with torch.no_grad():
        model.lm_head.weight[tok.stop_ids] = -10  # greedy replies run to max_tokens
    base = save_checkpoint(root / "base", model, cfg, tokenizer_dir=tok.path)
    spec = LoraSpec.build(4, alpha=8.0)
    apply_lora(model, spec, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, layer in lora_layers(model):
            layer.lora_B.weight.copy_(0.5 * torch.randn(layer.lora_B.weight.shape, generator=g))
    adapter = write_adapter(root / "adapter", model, spec, str(base))
    lora_ckpt = root / "lora_ckpt"
    shutil.copytree(base, lora_ckpt)
    shutil.copytree(adapter, lora_ckpt / "adapter")
    return base, adapter, lora_ckpt, merge_lora(model).eval(), tok


def greedy(model, tok, n=6):
    ids = tok.encode_chat([{"role": "user", "content": "Hello there"}])
    eng = Engine(model, tok, CacheConfig(max_kv_tokens=2048))
    return eng.generate(ids, SamplingParams(max_tokens=n, temperature=0.0))[0].text


def chat(path, *extra):
    r = runner.invoke(app, ["chat", str(path), "--temperature", "0", "--max-tokens", "6",
                            "--device", "cpu", "--prompt", "Hello there", *map(str, extra)])
    assert r.exit_code == 0, r.output
    return r.stdout


def test_load_model_merges_the_adapter(setup):
    base, adapter, lora_ckpt, merged, _ = setup
    x = torch.randint(0, 50, (1, 9))
    want = merged(x).logits
    torch.testing.assert_close(load_model(base, adapter=adapter, device="cpu")(x).logits, want)
    torch.testing.assert_close(load_model(lora_ckpt, device="cpu")(x).logits, want)
    assert not torch.allclose(load_model(base, device="cpu")(x).logits, want, atol=1e-3)


def test_chat_with_an_adapter(setup):
    base, adapter, lora_ckpt, merged, tok = setup
    reply = greedy(merged, tok) + "\n"
    assert chat(base, "--adapter", adapter) == reply
    assert chat(lora_ckpt) == reply  # a LoRA checkpoint's own adapter/


def test_export_merge_lora_writes_merged_hf_weights(setup, tmp_path):
    base, _, lora_ckpt, merged, _ = setup
    r = runner.invoke(app, ["export", str(lora_ckpt), str(tmp_path / "m"), "--merge-lora"])
    assert r.exit_code == 0, r.output
    hf, _, info = load_pretrained(tmp_path / "m")
    assert info["format"] == "hf" and not (tmp_path / "m" / "adapter").exists()
    x = torch.randint(0, 50, (2, 7))
    torch.testing.assert_close(hf(x).logits, merged(x).logits, rtol=1e-5, atol=1e-5)
    r = runner.invoke(app, ["export", str(base), str(tmp_path / "n"), "--merge-lora"])
    assert r.exit_code == 2 and "no LoRA adapter to merge" in r.output
    assert not (tmp_path / "n").exists()


def test_inspect_weights_and_serve_bench_take_an_adapter(setup, tmp_path):
    base, adapter, _, _, _ = setup
    r = runner.invoke(app, ["inspect-weights", str(base), "--adapter", str(adapter), "--json"])
    assert r.exit_code in (0, 1), r.output
    names = {t["name"] for t in json.loads(r.stdout)["checkpoints"][0]["tensors"]}
    assert "layers.0.attn.q_proj.weight" in names
    assert not any(".lora_" in n for n in names)  # merged: no adapter tensors remain
    r = runner.invoke(app, ["serve-bench", str(base), "--adapter", str(adapter),
                            "--num-prompts", "2", "--input-len", "4:8", "--output-len", "2:3",
                            "--warmup", "0", "--max-kv-tokens", "512", "--device", "cpu",
                            "--json"])
    assert r.exit_code == 0, r.output


def test_serve_engine_merges_the_adapter(setup):
    from astrai.serve.config import ServeConfig
    from astrai.serve.server import load_engine

    base, adapter, _, merged, _ = setup
    engine = load_engine(ServeConfig(model_path=str(base), adapter=str(adapter),
                                     device="cpu"))
    x = torch.randint(0, 50, (1, 5))
    torch.testing.assert_close(engine.model(x).logits, merged(x).logits)


def test_bad_adapter_is_one_line_exit_2(setup, tmp_path):
    base = setup[0]
    r = runner.invoke(app, ["chat", str(base), "--prompt", "hi", "--adapter", str(tmp_path)])
    assert r.exit_code == 2 and "no adapter_config.json" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_eval_takes_an_adapter(setup, tmp_path):
    """`astrai eval --adapter` scores the merged model: the same nll as a checkpoint
    holding the merged weights, unlike the base; a LoRA checkpoint uses its own."""
    from astrai.eval.perplexity import evaluate_perplexity

    base, adapter, lora_ckpt, merged, tok = setup
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps({"text": "To be, or not to be, that is the question."}) + "\n")
    merged_ckpt = save_checkpoint(tmp_path / "merged", merged, merged.config,
                                  tokenizer_dir=tok.path)
    want = evaluate_perplexity(merged_ckpt, held, device="cpu")

    def nll(*args):
        r = runner.invoke(app, ["eval", *map(str, args), "--data", str(held), "--device",
                                "cpu", "--json"])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["nll"]

    assert nll(base, "--adapter", adapter) == pytest.approx(want.nll, rel=1e-5)
    assert nll(lora_ckpt) == pytest.approx(want.nll, rel=1e-5)
    assert nll(base) != pytest.approx(want.nll, rel=1e-3)


def test_export_gguf_merges_the_adapter(setup, tmp_path):
    gguf = pytest.importorskip("gguf")
    from astrai.model.gguf_names import gguf_name, unpermute_rows

    _, _, lora_ckpt, merged, _ = setup
    r = runner.invoke(app, ["export", str(lora_ckpt), str(tmp_path / "m.gguf"), "--format",
                            "gguf", "--dtype", "f32"])
    assert r.exit_code == 2 and "--merge-lora" in r.output  # full weights only
    assert not (tmp_path / "m.gguf").exists()
    r = runner.invoke(app, ["export", str(lora_ckpt), str(tmp_path / "m.gguf"), "--format",
                            "gguf", "--dtype", "f32", "--merge-lora"])
    assert r.exit_code == 0, r.output
    got = {t.name: t.data for t in gguf.GGUFReader(tmp_path / "m.gguf").tensors}
    name = "layers.0.attn.q_proj.weight"
    q = unpermute_rows(torch.from_numpy(got[gguf_name(name)].copy()), merged.config.n_heads)
    torch.testing.assert_close(q, merged.state_dict()[name], rtol=0, atol=0)
