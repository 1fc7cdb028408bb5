"""Every consumer of a checkpoint reads a DCP one (--checkpoint-format dcp) as it reads the
full one: `convert-checkpoint` both ways, then info, chat, export (hf, gguf), eval and
inspect-weights give the same results on both; a damaged DCP directory is one line, exit 2."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from astrai.data.testing import tiny_tokenizer
from astrai.model import build_model, get_preset
from astrai.model.checkpoint import save_checkpoint
from astrai_cli.main import app

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(full checkpoint, the same converted to DCP by the CLI)."""
    root = tmp_path_factory.mktemp("dcp")
    tok = tiny_tokenizer(root / "tok", vocab_size=512)
    cfg = get_preset("tiny", vocab_size=512, dim=32, n_layers=2, n_heads=2, n_kv_heads=1,
                     head_dim=16, ffn_dim=64, max_seq_len=64)
    full = save_checkpoint(root / "full", build_model(cfg, seed=0), cfg, tokenizer_dir=tok.path,
                           meta={"step": 7})
    r = runner.invoke(app, ["convert-checkpoint", str(full), str(root / "dcp")])
    assert r.exit_code == 0, r.output
    assert (root / "dcp" / "dcp" / ".metadata").is_file()
    assert not (root / "dcp" / "model.safetensors").exists()
    return full, root / "dcp"


def both(args_for) -> tuple:
    """The same command on the full and on the DCP checkpoint (stdout each)."""
    out = []
    for r in (runner.invoke(app, args_for(0)), runner.invoke(app, args_for(1))):
        assert r.exit_code == 0, r.output
        out.append(r.stdout)
    return tuple(out)


def test_convert_back_gives_the_same_weights(pair, tmp_path):
    full, dcp = pair
    r = runner.invoke(app, ["convert-checkpoint", str(dcp), str(tmp_path / "back")])
    assert r.exit_code == 0, r.output
    a, b = load_file(full / "model.safetensors"), load_file(tmp_path / "back" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    r = runner.invoke(app, ["convert-checkpoint", str(dcp), str(tmp_path / "back")])
    assert r.exit_code == 2 and "already exists" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_info_chat_eval_inspect_read_dcp(pair, tmp_path):
    paths = [str(p) for p in pair]
    a, b = both(lambda i: ["info", paths[i], "--json"])
    ja, jb = json.loads(a), json.loads(b)
    assert ja["params"] == jb["params"] and ja["config"] == jb["config"]
    a, b = both(lambda i: ["chat", paths[i], "--prompt", "Hello", "--temperature", "0",
                           "--max-tokens", "6", "--device", "cpu", "--threads", "1"])
    assert a == b and a.strip()
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps({"text": "To be, or not to be, that is the question."}) + "\n")
    a, b = both(lambda i: ["eval", paths[i], "--data", str(held), "--device", "cpu", "--json"])
    assert json.loads(a) == json.loads(b)
    a, b = both(lambda i: ["inspect-weights", paths[i], "--json"])
    ca, cb = json.loads(a)["checkpoints"][0], json.loads(b)["checkpoints"][0]
    assert ca["tensors"] and ca["step"] == 7
    for key in ("n_params", "totals", "tensors", "overflow", "dead_zone", "gains"):
        assert ca[key] == cb[key], key


def test_export_hf_and_gguf_from_dcp(pair, tmp_path):
    paths = [str(p) for p in pair]
    both(lambda i: ["export", paths[i], str(tmp_path / f"hf{i}"), "--format", "hf"])
    a, b = (load_file(tmp_path / f"hf{i}" / "model.safetensors") for i in (0, 1))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    both(lambda i: ["export", paths[i], str(tmp_path / f"m{i}.gguf"), "--format", "gguf"])
    from gguf import GGUFReader

    ta, tb = ({t.name: t.data.tobytes() for t in GGUFReader(str(tmp_path / f"m{i}.gguf")).tensors}
              for i in (0, 1))
    assert ta == tb and ta


def test_damaged_dcp_checkpoint_is_one_line_exit_2(pair, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(pair[1], bad)
    (bad / "dcp" / "__0_0.distcp").unlink()
    for cmd in (["info", str(bad)], ["chat", str(bad), "--prompt", "hi", "--device", "cpu"],
                ["export", str(bad), str(tmp_path / "out"), "--format", "hf"]):
        r = runner.invoke(app, cmd)
        assert r.exit_code == 2, (cmd, r.output)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "__0_0.distcp: missing shard" in lines[0], (cmd, r.stderr)
        assert "copy the whole checkpoint directory" in lines[0]
    shutil.copy2(pair[1] / "dcp" / "__0_0.distcp", bad / "dcp" / "__0_0.distcp")
    shard = bad / "dcp" / "__0_0.distcp"
    shard.write_bytes(b"\0" * shard.stat().st_size)  # the right length, garbage inside
    for cmd in (["chat", str(bad), "--prompt", "hi", "--device", "cpu"],
                ["export", str(bad), str(tmp_path / "out"), "--format", "gguf"]):
        r = runner.invoke(app, cmd)
        assert r.exit_code == 2, (cmd, r.output)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "unreadable DCP data" in lines[0], (cmd, r.stderr)
        assert "Traceback" not in r.output and "weights_only" not in lines[0]  # no unsafe advice


def test_train_dcp_then_resume_on_another_batch_layout(tmp_path):
    """`astrai train --checkpoint-format dcp --async-checkpoint` writes DCP checkpoints;
    `astrai resume --batch-size 1 --grad-accum-steps 4` continues the batch-2 x 2 run from
    step 2 (global batch 4 kept) to the same losses; a layout that changes the global batch
    is one line, exit 2."""
    import shutil

    from astrai.data.testing import tiny_dataset

    from .test_train_cmd import SMALL

    data = tiny_dataset(tmp_path / "data", "pretrain", n=24, n_val=4)
    out = tmp_path / "run"
    r = runner.invoke(app, ["train", "--data", str(data), "--out", str(out), *SMALL,
                            "--batch-size", "2", "--grad-accum-steps", "2", "--max-steps", "4",
                            "--ckpt-interval", "2", "--keep-last", "0", "--checkpoint-format",
                            "dcp", "--async-checkpoint", "--max-lr", "3e-3"])
    assert r.exit_code == 0, r.output
    assert (out / "checkpoints" / "step_4" / "dcp" / ".metadata").is_file()
    before = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(out / "checkpoints" / "step_4")  # as if stopped after step 2
    r = runner.invoke(app, ["resume", str(out), "--batch-size", "4"])
    assert r.exit_code == 2 and "global batch" in r.stderr, r.output
    assert len(r.stderr.strip().splitlines()) == 1
    r = runner.invoke(app, ["resume", str(out), "--batch-size", "1", "--grad-accum-steps", "4",
                            "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["resumed_from"].endswith("step_2")
    after = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(after) == 4
    torch.testing.assert_close(after, before, atol=1e-5, rtol=0)
