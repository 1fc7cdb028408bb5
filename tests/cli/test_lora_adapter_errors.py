"""A broken LoRA adapter given to `astrai chat --adapter` or `astrai serve --lora` is one
`error:` line naming the file and the key, exit 2, never a traceback; so are a path no
file system takes, an adapter name with a newline and a rank above --max-lora-rank."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from astrai.data.testing import tiny_tokenizer
from astrai_cli.main import app

from ..infer.lora_fixtures import broken_adapters, make_adapters, tiny_llama

pytest.importorskip("peft")
runner = CliRunner()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-errors")
    base = tiny_llama(root, tokenizer_dir=tiny_tokenizer(root).path)
    adapters = make_adapters(root, base)
    return base, adapters, broken_adapters(root, adapters["sql"])


def one_error_line(args: list[str], *words: str) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and len(errors[0]) < 500, r.output
    for w in words:
        assert w in errors[0], r.output
    return errors[0]


@pytest.mark.parametrize("which", ["r0", "r-text", "r-null", "r-list", "r-frac", "alpha-text",
                                   "alpha-inf", "targets-int", "not-utf8", "deep",
                                   "nan-weight"])
def test_chat_with_a_broken_adapter(dirs, which):
    base, _, broken = dirs
    path, words = broken[which]
    one_error_line(["chat", str(base), "--adapter", str(path), "--prompt", "hi",
                    "--device", "cpu"], words)


def test_chat_with_an_absurd_adapter_path(dirs):
    one_error_line(["chat", str(dirs[0]), "--adapter", "a" * 100_000, "--prompt", "hi"],
                   "100000 characters")


@pytest.fixture
def never_serve(monkeypatch):
    """A server that got past loading would serve until stopped: fail instead."""
    from astrai.serve.server import Server

    def run(self, on_ready=None):
        raise AssertionError("the server started with a broken adapter")

    monkeypatch.setattr(Server, "run", run)


@pytest.mark.parametrize("which", ["r0", "r-frac", "targets-int", "nan-weight"])
def test_serve_with_a_broken_lora(dirs, which, never_serve):
    base, _, broken = dirs
    path, words = broken[which]
    one_error_line(["serve", str(base), "--lora", f"bad={path}", "--device", "cpu",
                    "--port", "0"], words)


@pytest.mark.parametrize("args,words", [
    (["--lora", "sql=" + "a" * 100_000], "100000 characters"),
    (["--lora", "bad\nname=/tmp"], "lora name"),
    (["--lora", "x" * 200 + "=/tmp"], "lora name"),
    (["--max-lora-rank", "0"], "--max-lora-rank 0"),
    (["--max-loaded-loras", "1", "--lora", "a=/tmp", "--lora", "b=/tmp"],
     "--max-loaded-loras 1"),
])
def test_serve_lora_flags_fail_before_the_model_loads(dirs, args, words, never_serve):
    one_error_line(["serve", str(dirs[0]), *args], words)


def test_serve_refuses_a_rank_above_max_lora_rank(dirs, never_serve):
    base, adapters, _ = dirs
    one_error_line(["serve", str(base), "--lora", f"poet={adapters['poet']}",
                    "--max-lora-rank", "4", "--device", "cpu", "--port", "0"],
                   "r 8 is above the largest rank served, 4", "--max-lora-rank")
