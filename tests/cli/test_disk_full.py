"""A full disk while a command writes: one line naming the path and the free space, exit 2,
no traceback, and nothing half-written (astrai.diskfull). The disk is filled portably: the
commands run in a subprocess whose file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored) makes a
write past N bytes fail with EFBIG, as ENOSPC does on a full disk."""

from __future__ import annotations

import errno
import json
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from astrai.data.assets import tiny_corpus_path
from astrai.data.testing import tiny_tokenizer
from astrai.diskfull import DiskFullError, is_disk_full, writing
from astrai.model import ModelConfig, build_model
from astrai.model.checkpoint import save_checkpoint

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data"


def run(limit: int, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    def fill():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, "-m", "astrai_cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, preexec_fn=fill)


def assert_one_line(r: subprocess.CompletedProcess, path: str) -> None:
    err = r.stderr.strip()
    assert r.returncode == 2, err[-3000:]
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith("error: ") and path in last and "disk full" in last.replace(
        "disk is full", "disk full")
    assert " free" in last


def leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("diskfull")
    tok = tiny_tokenizer(root)
    cfg = ModelConfig(vocab_size=tok.vocab_size, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                      ffn_dim=128, max_seq_len=256)
    save_checkpoint(root / "ckpt", build_model(cfg, seed=0), cfg, tokenizer_dir=tok.path)
    spec = {"kind": "pretrain", "inputs": [str(EXAMPLES / "shakespeare_train.jsonl")],
            "tokenizer": str(tok.path), "output": str(root / "data"),
            "sections": [{"field": "text", "action": "train"}], "max_seq_len": 128,
            "packing": {"mode": "bfd_split"}, "format": "h5"}
    (root / "spec.json").write_text(json.dumps(spec))
    r = subprocess.run([sys.executable, "-m", "astrai_cli.main", "preprocess",
                        str(root / "spec.json")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return root


@pytest.mark.parametrize("fmt, out", [("hf", "out_hf"), ("gguf", "out.gguf")])
def test_export(work, tmp_path, fmt, out):
    if fmt == "gguf":
        pytest.importorskip("gguf")
    r = run(100_000, "export", str(work / "ckpt"), out, "--format", fmt, cwd=tmp_path)
    assert_one_line(r, out)
    assert not (tmp_path / out).exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("fmt", ["h5", "bin"])
def test_preprocess(work, tmp_path, fmt):
    """HDF5 crashes the interpreter (SIGSEGV) freeing a file whose write failed: the shard
    writer hands it a file object that absorbs the failure, then reports it."""
    spec = json.loads((work / "spec.json").read_text())
    spec.update(output=str(tmp_path / "data"), format=fmt)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    r = run(200_000, "preprocess", "spec.json", cwd=tmp_path)
    assert_one_line(r, str(tmp_path / "data"))
    assert not (tmp_path / "data").exists() and leftovers(tmp_path) == []


def test_tokenizer_train_leaves_no_partial_directory(tmp_path):
    r = run(3_000, "tokenizer", "train", str(tiny_corpus_path()), "--vocab-size", "300",
            "--out", "tok", cwd=tmp_path)
    assert_one_line(r, "tok")
    assert not (tmp_path / "tok").exists() and leftovers(tmp_path) == []


def test_eval_out(work, tmp_path):
    r = run(100, "eval", str(work / "ckpt"), "--data", str(EXAMPLES / "shakespeare_val.jsonl"),
            "--limit", "2", "--out", "res.json", "--device", "cpu", cwd=tmp_path)
    assert_one_line(r, "res.json")
    assert list(tmp_path.iterdir()) == []


TRAIN = ["train", "--strategy", "seq", "--model", "tiny", "--model-overrides", "n_layers=1",
         "--model-overrides", "dim=64", "--model-overrides", "n_heads=2", "--model-overrides",
         "n_kv_heads=1", "--model-overrides", "head_dim=32", "--model-overrides",
         "ffn_dim=64", "--max-steps", "2", "--out", "run", "--device", "cpu"]


@pytest.mark.parametrize("limit, path", [(500, "run/train_config.json"),
                                         (20_000, "run/checkpoints")])
def test_train_before_its_first_checkpoint(work, tmp_path, limit, path):
    """The run's first file, or its first checkpoint (the trainer's own line then: which
    checkpoint is the last good one, here none)."""
    r = run(limit, *TRAIN, "--data", str(work / "data"), cwd=tmp_path)
    assert_one_line(r, path)
    if limit > 500:
        assert "no checkpoint of this run was saved yet" in r.stderr
    ckpts = tmp_path / "run" / "checkpoints"
    assert not ckpts.exists() or not [p for p in ckpts.iterdir() if p.name.startswith("step")]


def deep(kind: str) -> str:
    return ('{"a":' * 100_000 + "1" + "}" * 100_000) if kind == "object" else \
        ("[" * 100_000 + "]" * 100_000)


@pytest.mark.parametrize("kind", ["object", "array"])
def test_deeply_nested_configs_are_one_line(work, tmp_path, kind):
    import shutil

    shutil.copytree(work / "ckpt", tmp_path / "ck")
    (tmp_path / "ck" / "config.json").write_text(deep(kind))
    (tmp_path / "tc.json").write_text(deep(kind))
    for args, path in ((("info", "ck"), "ck/config.json"),
                       (("train", "--config", "tc.json"), "tc.json")):
        r = subprocess.run([sys.executable, "-m", "astrai_cli.main", *args], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert f"{path}: " in r.stderr and "nested too deeply" in r.stderr


@pytest.mark.parametrize("exc", [
    OSError(errno.ENOSPC, "No space left on device"),
    OSError(errno.EDQUOT, "Disk quota exceeded"),
    RuntimeError("[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed "
                 "writing file data/0: file write failed"),  # torch.save
    Exception("No space left on device (os error 28)"),  # the tokenizers library
    OSError("32768 requested and 21672 written"),  # numpy's tofile
])
def test_each_writer_s_way_of_saying_it_is_recognised(exc):
    assert is_disk_full(exc)
    with pytest.raises(DiskFullError, match="^out.bin: the disk is full"), writing("out.bin"):
        raise exc


def test_other_errors_pass_through():
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert is_disk_full(wrapped)
    with pytest.raises(PermissionError), writing("x"):
        raise PermissionError(errno.EACCES, "Permission denied")
