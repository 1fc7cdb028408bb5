"""A .gguf file wherever a checkpoint directory goes, through Typer's CliRunner: `chat
--prompt` replies as the checkpoint it was exported from, `info` shows the architecture and
tensor types, a quantized file says in one line that it loads dequantized, `train --model
x.gguf` fine-tunes from it and says so, and a hostile file is one `error:` line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from astrai.data.testing import tiny_dataset, tiny_tokenizer
from astrai.model import ModelConfig, build_model
from astrai.model.checkpoint import save_checkpoint
from astrai_cli.main import app

gguf = pytest.importorskip("gguf")
from astrai.model.gguf_export import export_gguf

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path, Path, Path]:
    """(root, checkpoint, its f32 GGUF, its q8_0 GGUF); stop-token logits 0, so greedy
    replies run to --max-tokens."""
    root = tmp_path_factory.mktemp("gguf-cli")
    tok = tiny_tokenizer(root)
    cfg = ModelConfig(vocab_size=tok.vocab_size, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                      ffn_dim=128, max_seq_len=256)
    model = build_model(cfg, seed=0)
    with torch.no_grad():
        model.lm_head.weight[tok.stop_ids] = 0
    ck = save_checkpoint(root / "ck", model, cfg, tokenizer_dir=tok.path)
    return (root, ck, export_gguf(ck, root / "m.gguf", dtype=torch.float32),
            export_gguf(ck, root / "q8.gguf", quantize="q8_0"))


def chat(path: Path, *extra: str):
    return runner.invoke(app, ["chat", str(path), "--temperature", "0", "--max-tokens", "7",
                               "--device", "cpu", "--threads", "1", "-p", "Hello there",
                               *extra])


def test_chat_on_a_gguf_replies_as_its_checkpoint(files):
    _, ck, f32, q8 = files
    want, got = chat(ck), chat(f32)
    assert want.exit_code == 0 and got.exit_code == 0, got.output
    assert got.stdout == want.stdout and len(got.stdout) > 8
    r = chat(q8)
    assert r.exit_code == 0, r.output
    assert (f"{q8}: q8_0 weights dequantized to float32; astrai has no matching format"
            in r.stderr)
    assert "dequantized" not in got.stderr


def test_info_shows_architecture_and_tensor_types(files):
    _, _, f32, q8 = files
    r = runner.invoke(app, ["info", str(q8), "--json"])
    assert r.exit_code == 0, r.output
    import json

    src = json.loads(r.stdout)["source"]
    assert src["format"] == "gguf" and src["model_type"] == "llama"
    assert src["gguf"]["tensor_types"] == "f32 x5, q8_0 x16"  # norms stay f32
    assert src["gguf"]["tokenizer.ggml.model"] == "gpt2"
    r = runner.invoke(app, ["info", str(f32)])
    assert r.exit_code == 0, r.output
    assert "gguf architecture" in r.stdout and "f32 x21" in r.stdout


def test_train_starts_from_a_gguf_and_says_so(files):
    root, _, _, q8 = files
    data = tiny_dataset(root, max_seq_len=32, n=16, n_val=4)
    r = runner.invoke(app, ["train", "--strategy", "seq", "--data", str(data), "--model",
                            str(q8), "--max-steps", "2", "--out", str(root / "run"),
                            "--device", "cpu", "--window-size", "32"])
    assert r.exit_code == 0, r.output
    assert (f"{q8}: fine-tuning starts from this GGUF file, q8_0 weights dequantized to "
            "float32" in r.stderr)
    assert (root / "run" / "checkpoints" / "step_2" / "model.safetensors").is_file()


@pytest.mark.parametrize("cmd", ["chat", "info"])
def test_a_truncated_gguf_is_one_line(files, tmp_path, cmd):
    _, _, f32, _ = files
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(f32.read_bytes()[:4000])
    r = runner.invoke(app, [cmd, str(bad)] + (["-p", "hi"] if cmd == "chat" else []))
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {bad}: not a readable GGUF file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.gguf"]


def test_inspect_weights_and_eval_take_a_gguf(files, tmp_path):
    import json

    _, ck, f32, q8 = files
    r = runner.invoke(app, ["inspect-weights", str(q8), "--json"])
    assert r.exit_code == 0, r.output
    assert "q8_0 weights dequantized to float32" in r.stderr
    scan = json.loads(r.stdout)
    assert "layers.0.attn.q_proj.weight" in json.dumps(scan)
    data = tmp_path / "held.jsonl"
    data.write_text("".join(json.dumps({"text": f"Hello there number {i}."}) + "\n"
                            for i in range(4)))
    want, got = (runner.invoke(app, ["eval", str(p), "--data", str(data), "--device", "cpu",
                                     "--json"]) for p in (ck, f32))
    assert want.exit_code == 0 and got.exit_code == 0, got.output
    bpb = [json.loads(x.stdout)["bpb"] for x in (want, got)]
    assert bpb[0] == pytest.approx(bpb[1], rel=1e-5)


def test_serve_and_serve_bench_take_a_gguf(files, tmp_path):
    """A real `astrai serve` subprocess on the f32 file completes greedily as the engine does
    on the checkpoint it was exported from; serve-bench runs in-process on the q8_0 file."""
    import json
    import urllib.request

    from astrai.infer import CacheConfig, Engine, SamplingParams
    from astrai.infer.loading import load_model, load_tokenizer
    from tests.serve.conftest import ServeProcess

    _, ck, f32, q8 = files
    srv = ServeProcess([str(f32), "--max-kv-tokens", "1024", "--served-model-name", "m"],
                       tmp_path / "serve.log")
    try:
        body = json.dumps({"model": "m", "prompt": "Hello there", "max_tokens": 6,
                           "temperature": 0}).encode()
        req = urllib.request.Request(srv.url + "/v1/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            text = json.loads(r.read())["choices"][0]["text"]
    finally:
        srv.stop()
    tok = load_tokenizer(ck)
    eng = Engine(load_model(ck, device="cpu"), tok, CacheConfig(max_kv_tokens=1024))
    want = eng.generate([tok.encode("Hello there")],
                        SamplingParams(max_tokens=6, temperature=0.0))[0].text
    assert text == want and text
    r = runner.invoke(app, ["serve-bench", str(q8), "--num-prompts", "2", "--input-len", "4:8",
                            "--output-len", "2:4", "--warmup", "0", "--device", "cpu",
                            "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["runs"][0]["completed"] == 2
    assert "q8_0 weights dequantized to float32" in r.stderr
