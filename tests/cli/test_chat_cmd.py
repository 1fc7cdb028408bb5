"""`astrai chat`: --prompt through CliRunner, a scripted session through a pipe, and a
pseudo-terminal session with a Ctrl-C during a reply."""

import os
import re
import select
import subprocess
import sys
import time

import pytest
import torch
from typer.testing import CliRunner

from astrai.data.testing import tiny_tokenizer
from astrai.infer import CacheConfig, Engine, SamplingParams
from astrai.model import ModelConfig, build_model
from astrai.model.checkpoint import save_checkpoint
from astrai_cli.main import app

runner = CliRunner()
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8", "NO_COLOR": "1",
       "TERM": "dumb"}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """Random weights whose stop-token logits are 0: greedy replies run to max_tokens."""
    root = tmp_path_factory.mktemp("chat")
    tok = tiny_tokenizer(root)
    cfg = ModelConfig(vocab_size=tok.vocab_size, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                      ffn_dim=128, max_seq_len=2048)
    model = build_model(cfg, seed=0)
    with torch.no_grad():
        model.lm_head.weight[tok.stop_ids] = 0
    path = save_checkpoint(root / "ckpt", model, cfg, tokenizer_dir=tok.path)
    save_checkpoint(root / "bare", model, cfg)
    return path, model, tok


def greedy(model, tok, ids, n):
    eng = Engine(model, tok, CacheConfig(max_kv_tokens=4096))
    return eng.generate(ids, SamplingParams(max_tokens=n, temperature=0.0))[0].text


def test_prompt_prints_exactly_the_reply(ckpt):
    path, model, tok = ckpt
    args = ["chat", str(path), "--temperature", "0", "--max-tokens", "7", "--device", "cpu",
            "--threads", "1"]
    r = runner.invoke(app, [*args, "--prompt", "Hello there", "--system", "Be brief."])
    assert r.exit_code == 0, r.output
    ids = tok.encode_chat([{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "Hello there"}])
    assert r.stdout == greedy(model, tok, ids, 7) + "\n"
    # a training run directory stands for its newest checkpoint, and stderr says which
    run = path.parent / "run"
    if not run.exists():
        (run / "checkpoints").mkdir(parents=True)
        (run / "checkpoints" / "step_3").symlink_to(path)
    r = runner.invoke(app, [*args, "--prompt", "Hello there", "--system", "Be brief."])
    r2 = runner.invoke(app, ["chat", str(run), *args[2:], "-p", "Hello there", "--system",
                             "Be brief."])
    assert r2.exit_code == 0 and r2.stdout == r.stdout, r2.output
    assert f"using its newest checkpoint {run}/checkpoints/step_3" in r2.stderr
    # --no-template: the model continues the raw text; '-' reads the message from stdin.
    r = runner.invoke(app, [*args, "--prompt", "-", "--no-template"], input="Once upon")
    assert r.exit_code == 0, r.output
    ids = tok.encode("Once upon", add_special_tokens=True)
    assert r.stdout == greedy(model, tok, ids, 7) + "\n"


def test_quantize_int8_replies_as_the_engine_over_the_int8_model(ckpt):
    from astrai.infer.loading import load_model

    path, _, tok = ckpt
    r = runner.invoke(app, ["chat", str(path), "--temperature", "0", "--max-tokens", "5",
                            "--device", "cpu", "--quantize", "int8", "--prompt", "Hello"])
    assert r.exit_code == 0, r.output
    q = load_model(path, device="cpu", quantize="int8")
    ids = tok.encode_chat([{"role": "user", "content": "Hello"}])
    assert r.stdout == greedy(q, tok, ids, 5) + "\n"


def test_enforce_eager_reaches_the_engine_and_replies_the_same(ckpt, monkeypatch):
    from astrai.infer import engine as engine_module

    path, model, tok = ckpt
    seen = []
    init = engine_module.Engine.__init__

    def spy(self, *a, **kw):
        seen.append(kw.get("decode"))
        init(self, *a, **kw)

    monkeypatch.setattr(engine_module.Engine, "__init__", spy)
    args = ["chat", str(path), "--temperature", "0", "--max-tokens", "5", "--device", "cpu",
            "--prompt", "Hello"]
    a, b = runner.invoke(app, args), runner.invoke(app, [*args, "--enforce-eager"])
    assert a.exit_code == b.exit_code == 0 and a.stdout == b.stdout, b.output
    assert seen == ["auto", "eager"]
    for cmd in ("chat", "serve", "serve-bench", "eval"):
        assert "--enforce-eager" in runner.invoke(app, [cmd, "--help"]).stdout


@pytest.mark.parametrize("flags, why", [
    (["--top-p", "1.5"], "top_p=1.5: must be in (0, 1]"),
    (["--temperature", "-1"], "temperature=-1.0: must be >= 0"),
    (["--max-tokens", "0"], "max_tokens=0: must be an integer >= 1"),
    (["--top-k", "-3"], "top_k=-3"),
    (["--top-k", "1180591620717411303424"], "top_k=1180591620717411303424: must be an integer"),
    (["--seed", str(2**70)], f"seed={2**70}: must be None or an integer"),
    (["--quantize", "fp4"], "--quantize 'fp4': use none or int8"),
])
def test_invalid_sampling_values_exit_2(ckpt, flags, why):
    r = runner.invoke(app, ["chat", str(ckpt[0]), "--prompt", "hi", *flags])
    assert r.exit_code == 2 and why in r.stderr and "Traceback" not in r.output
    assert len(r.stderr.strip().splitlines()) == 1


def test_checkpoint_without_tokenizer_exits_2_with_the_fix(ckpt, tmp_path):
    bare = ckpt[0].parent / "bare"
    r = runner.invoke(app, ["chat", str(bare), "--prompt", "hi"])
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no tokenizer.json" in lines[0] and "cp " in lines[0]
    r = runner.invoke(app, ["chat", str(tmp_path / "nowhere"), "--prompt", "hi"])
    assert r.exit_code == 2 and "not a checkpoint directory" in r.stderr
    r = runner.invoke(app, ["chat", str(ckpt[0]), "--prompt", "  "])
    assert r.exit_code == 2 and "--prompt is empty" in r.stderr


def test_scripted_session_without_a_terminal(ckpt):
    path, model, tok = ckpt
    script = "".join(line + "\n" for line in [
        "/set temperature 0", "/set max_tokens 5", "/set top_p 7", "Hello", "/system Be brief.",
        "How are \\", "you?", "/stats", "/reset", "/bogus", "/exit", "never sent"])
    r = runner.invoke(app, ["chat", str(path), "--device", "cpu"], input=script)
    assert r.exit_code == 0, r.output
    r1 = greedy(model, tok, tok.encode_chat([{"role": "user", "content": "Hello"}]), 5)
    r2 = greedy(model, tok, tok.encode_chat([
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": r1}, {"role": "user", "content": "How are \nyou?"},
    ]), 5)
    # No prompts without a terminal: stdout is the replies, one per line.
    assert r.stdout == f"{r1}\n{r2}\n"
    for text in ("temperature = 0.0", "max_tokens = 5", "/set top_p 7: must be in (0, 1]",
                 "system prompt set", "last reply: 5 tokens", "conversation reset (2 turns",
                 "unknown command /bogus"):
        assert text in r.stderr, text


class Pty:
    """A child process on a pseudo-terminal, driven like a user at a keyboard."""

    # In its own session, the child makes the tty its controlling terminal before exec'ing
    # the command, so Ctrl-C typed on the tty sends it SIGINT as a shell would.
    ADOPT_TTY = "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    EXEC = "os.execv(sys.executable, [sys.executable] + sys.argv[1:])"
    # `nohup cmd &` and some CI wrappers start processes with SIGINT ignored, which survives
    # exec: the chat must still answer Ctrl-C.
    IGNORE_SIGINT = "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "

    def __init__(self, args, ignore_sigint=False):
        self.master, slave = os.openpty()
        script = self.ADOPT_TTY + (self.IGNORE_SIGINT if ignore_sigint else "") + self.EXEC
        self.proc = subprocess.Popen([sys.executable, "-c", script, *args], stdin=slave,
                                     stdout=slave, stderr=slave, env=ENV, start_new_session=True)
        os.close(slave)
        self.buf = ""
        self.before = ""  # what the last expect() skipped over

    def expect(self, pattern, timeout=120.0):
        end = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.buf)
            if m:
                self.before, self.buf = self.buf[:m.start()], self.buf[m.end():]
                return m
            left = end - time.monotonic()
            if left <= 0 or self.proc.poll() is not None and not self._ready(0):
                raise AssertionError(f"{pattern!r} not seen (child exit status "
                                     f"{self.proc.poll()}); output so far: {self.buf!r}")
            if self._ready(min(left, 0.5)):
                try:
                    self.buf += os.read(self.master, 65536).decode("utf-8", "replace")
                except OSError:
                    pass

    def interrupt_until(self, pattern, tries=20):
        """Ctrl-C until `pattern` shows. CPython's readline notices a signal only when its
        select() is interrupted: a SIGINT that lands after the prompt is drawn but before
        select() is entered stays pending until the next key (a window a typing person never
        hits, but a test on a loaded machine does), so a lost one is sent again."""
        for _ in range(tries):
            self.send("\x03")
            try:
                return self.expect(pattern, timeout=3.0)
            except AssertionError:
                if self.proc.poll() is not None:
                    raise
        raise AssertionError(f"{pattern!r} not seen after {tries} Ctrl-C")

    def _ready(self, t):
        return bool(select.select([self.master], [], [], t)[0])

    def send(self, text):
        os.write(self.master, text.encode())

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.master)


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
@pytest.mark.parametrize("ignore_sigint", [False, True], ids=["sigint-default", "sigint-ignored"])
def test_interactive_session_in_a_pseudo_terminal(ckpt, ignore_sigint):
    tty = Pty(["-m", "astrai_cli.main", "chat", str(ckpt[0]), "--device", "cpu",
               "--temperature", "0"], ignore_sigint=ignore_sigint)
    try:
        tty.expect(r">>> ")
        tty.send("/set max_tokens 6\n")
        tty.expect(r"max_tokens = 6")
        tty.expect(r">>> ")
        tty.send("Hello\n")  # first turn
        tty.expect(r"Hello\r?\n")
        tty.expect(r">>> ")
        tty.send("How are you?\n")  # second turn, then its stats
        tty.expect(r">>> ")
        tty.send("/stats\n")
        m = tty.expect(r"last reply: 6 tokens.*\((\d+) from the prefix cache\)")
        assert int(m.group(1)) >= 16  # the first turn's pages were reused
        tty.expect(r">>> ")
        tty.send("/system Answer in French.\n")
        tty.expect(r"system prompt set")
        tty.expect(r">>> ")
        tty.send("/reset\n")
        tty.expect(r"conversation reset \(2 turns forgotten\)")
        tty.expect(r">>> ")
        tty.send("/set max_tokens 4000\n")  # a reply that would run to the context end
        tty.expect(r">>> ")
        tty.send("Tell me everything\n")
        tty.expect(r"Tell me everything\r?\n")  # the terminal's echo: not yet read
        tty.expect(r"\S")  # the reply streams: the program is inside it
        tty.send("QQXQQ")  # typed during the reply: not echoed into it
        tty.send("\x03")  # Ctrl-C stops the reply, not the program
        tty.expect(r"\(reply stopped\)")
        assert "QQXQQ" not in tty.before
        tty.expect(r">>> ")
        tty.send("/stats\n")
        tty.expect(r"finish: abort")
        tty.expect(r">>> ")
        tty.interrupt_until(r"type /exit or Ctrl-D")  # at the prompt: a hint, still running
        tty.expect(r">>> ")
        tty.send("/exit\n")
        assert tty.proc.wait(timeout=60) == 0
    finally:
        tty.close()


def test_json_schema_makes_every_reply_valid_json(ckpt, tmp_path):
    pytest.importorskip("llguidance")
    jsonschema = pytest.importorskip("jsonschema")
    import json
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 9},
                                               "s": {"type": "string", "maxLength": 4}},
              "required": ["n", "s"], "additionalProperties": False}
    f = tmp_path / "schema.json"
    f.write_text(json.dumps(schema))
    for seed in ("1", "2"):
        r = runner.invoke(app, ["chat", str(ckpt[0]), "--prompt", "hi", "--json-schema",
                                str(f), "--temperature", "1", "--seed", seed,
                                "--max-tokens", "64"])
        assert r.exit_code == 0, r.output
        jsonschema.validate(json.loads(r.stdout), schema)


@pytest.mark.parametrize("content, why", [
    (None, "cannot read it"), ("{nope", "not JSON"),
    ('{"type": "object", "dependentRequired": {"a": ["b"]}}', "dependentRequired"),
])
def test_bad_json_schema_files_exit_2_naming_the_file(ckpt, tmp_path, content, why):
    pytest.importorskip("llguidance")
    f = tmp_path / "s.json"
    if content is not None:
        f.write_text(content)
    r = runner.invoke(app, ["chat", str(ckpt[0]), "--prompt", "hi", "--json-schema", str(f)])
    assert r.exit_code == 2 and why in r.stderr and f"--json-schema {f}" in r.stderr


def test_speculative_flags_reach_the_engine_and_reply_the_same(ckpt, monkeypatch):
    from astrai.infer import engine as engine_module

    path, model, tok = ckpt
    seen = []
    init = engine_module.Engine.__init__

    def spy(self, *a, **kw):
        seen.append(kw.get("speculative"))
        init(self, *a, **kw)

    monkeypatch.setattr(engine_module.Engine, "__init__", spy)
    args = ["chat", str(path), "--temperature", "0", "--max-tokens", "8", "--device", "cpu",
            "--prompt", "Hello"]
    a = runner.invoke(app, args)
    b = runner.invoke(app, [*args, "--speculative", "ngram", "--num-speculative-tokens", "3"])
    c = runner.invoke(app, [*args, "--speculative-model", str(path)])
    assert a.exit_code == b.exit_code == c.exit_code == 0, (b.output, c.output)
    assert a.stdout == b.stdout == c.stdout
    assert seen[0] is None
    assert (seen[1].method, seen[1].num_speculative_tokens) == ("ngram", 3)
    assert (seen[2].method, seen[2].model) == ("draft", str(path))
    for cmd in ("chat", "serve", "serve-bench"):
        out = runner.invoke(app, [cmd, "--help"]).stdout
        assert "--speculative" in out and "--num-speculative-tokens" in out


@pytest.mark.parametrize("flags, why", [
    (["--speculative", "eagle"], "--speculative 'eagle': use none or ngram"),
    (["--speculative", "ngram", "--speculative-model", "."], "give one of them"),
    (["--speculative-model", "/nonexistent"], "not a model directory"),
    (["--speculative", "ngram", "--num-speculative-tokens", "0"], "num_speculative_tokens"),
])
def test_bad_speculative_flags_exit_2(ckpt, flags, why):
    r = runner.invoke(app, ["chat", str(ckpt[0]), "--prompt", "hi", *flags])
    assert r.exit_code == 2 and why in r.stderr and "Traceback" not in r.output
    assert len(r.stderr.strip().splitlines()) == 1


def test_speculative_model_takes_a_run_directory(ckpt, tmp_path):
    path, model, tok = ckpt
    run = tmp_path / "draft-run"
    save_checkpoint(run / "checkpoints" / "step_7", model, model.config, tokenizer_dir=tok.path)
    args = ["chat", str(path), "--temperature", "0", "--max-tokens", "8", "--device", "cpu",
            "--prompt", "Hello"]
    plain = runner.invoke(app, args)
    r = runner.invoke(app, [*args, "--speculative-model", str(run)])
    assert r.exit_code == 0, r.output
    assert r.stdout == plain.stdout and "step_7" in r.stderr


def test_a_draft_with_another_tokenizer_of_the_same_size_exits_2(ckpt, tmp_path):
    """Two vocabulary entries swapped: the same size, other ids for the same text."""
    import json

    path, model, tok = ckpt
    other = tmp_path / "other-tok"
    other.mkdir()
    for f in tok.path.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    data = json.loads((other / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(data))
    draft = save_checkpoint(tmp_path / "draft", model, model.config, tokenizer_dir=other)
    r = runner.invoke(app, ["chat", str(path), "--prompt", "hi", "--device", "cpu",
                            "--speculative-model", str(draft)])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and str(draft) in line and str(path) in line, line
    assert "tokenizer differs" in line
