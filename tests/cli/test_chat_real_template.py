"""`astrai chat` on a model with Qwen3's real tokenizer and template, which rewrites earlier
turns: a 5-turn conversation in a pseudo-terminal, greedy replies equal to transformers'
`generate` on the same rendered conversation, and the radix cache reusing earlier turns."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from astrai.infer.build import EngineOptions
from astrai.infer.chat_session import open_chat
from astrai.infer.params import SamplingParams
from tests.cli.test_chat_cmd import Pty
from tests.real_tokenizers import tiny_hf_model

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

TURNS = ["Hello", "Tell me about 深红 🙂", "  spaces around  ", "Second line\nhere", "Bye"]
N = 6

HF = textwrap.dedent("""
    import json, sys, torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path, convs, n, stop = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    for msgs in convs:
        ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True,
                                      return_dict=False)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        g = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                           eos_token_id=stop, pad_token_id=stop[0])
        out.append(tok.decode(g[0, len(ids):], skip_special_tokens=True))
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory):
    return tiny_hf_model("qwen3", tmp_path_factory.mktemp("qwen3-chat"))


@pytest.mark.slow
def test_greedy_replies_equal_transformers_generate(qwen3_model):
    session = open_chat(qwen3_model, EngineOptions(device="cpu"),
                        params=SamplingParams(max_tokens=N, temperature=0.0))
    convs, replies, cached = [], [], []
    for text in TURNS:
        convs.append(session.messages + [{"role": "user", "content": text}])
        replies.append("".join(session.reply(text)))
        cached.append(session.last.cached_tokens)
    assert len(session.messages) == 10
    # earlier turns' full pages (16 tokens) came from the radix cache
    assert cached[-1] >= 32, cached
    res = subprocess.run([sys.executable, "-c", HF, str(qwen3_model), json.dumps(convs), str(N),
                          json.dumps(session.tokenizer.stop_ids)],
                         check=True, capture_output=True, text=True, timeout=300,
                         env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert replies == json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_five_turns_in_a_pseudo_terminal(qwen3_model):
    tty = Pty(["-m", "astrai_cli.main", "chat", str(qwen3_model), "--device", "cpu",
               "--temperature", "0", "--max-tokens", str(N)])
    try:
        tty.expect(r">>> ")
        for text in TURNS:
            tty.send(text.replace("\n", "\\\n") + "\n")  # a backslash continues the line
            tty.expect(r">>> ")
        tty.send("/stats\n")
        m = tty.expect(r"last reply: \d+ tokens?.*\((\d+) from the prefix cache\)")
        assert int(m.group(1)) > 0
        tty.expect(r">>> ")
        tty.send("/exit\n")
        assert tty.proc.wait(timeout=60) == 0
    finally:
        tty.close()


def test_no_template_refuses_in_one_line_and_a_named_template_fixes_it(tmp_path):
    import shutil

    from typer.testing import CliRunner

    from astrai_cli.main import app

    src = tiny_hf_model("mistral", tmp_path)
    base = tmp_path / "mistral-base"  # Mistral-7B-v0.1 ships no chat template
    shutil.copytree(src, base)
    cfg = json.loads((base / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (base / "tokenizer_config.json").write_text(json.dumps(cfg))
    runner = CliRunner()
    args = ["chat", str(base), "--prompt", "hi", "--max-tokens", "3", "--temperature", "0",
            "--device", "cpu"]
    r = runner.invoke(app, args)
    assert r.exit_code == 2
    (line,) = r.stderr.strip().splitlines()
    assert f"{base} has no chat template" in line
    assert "--chat-template NAME|FILE" in line and "--no-template" in line
    r = runner.invoke(app, [*args, "--chat-template", "mistral"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["tokenizer", "info", str(base), "--json"])
    info = json.loads(r.stdout)
    assert info["template"] == "none" and info["stop_tokens"] == ["</s>"]
    assert any("no chat template" in w for w in info["warnings"])
    assert any("no pad token" in w for w in info["warnings"])
    # ChatML's markers are not tokens of Mistral's vocabulary: said, not silently used
    cfg["chat_template"] = "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>" \
                           "{% endfor %}"
    (base / "tokenizer_config.json").write_text(json.dumps(cfg))
    info = json.loads(runner.invoke(app, ["tokenizer", "info", str(base), "--json"]).stdout)
    assert info["template"] == "custom"
    assert any("<|im_start|> is not one token" in w for w in info["warnings"])
