"""Reasoning output (astrai/infer/reasoning.py): thinking told apart from the answer whole
and delta by delta, where the reply starts decided by the prompt, and Qwen3's
`enable_thinking` reaching its template as transformers' `apply_chat_template` passes it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from astrai.errors import ConfigError
from astrai.infer.reasoning import parser_for_template, reasoning_parser

from ..real_tokenizers import family_dir

QWEN_OPEN = "<|im_start|>assistant\n<think>\n"          # DeepSeek-R1-style: opened by the prompt
QWEN_OFF = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # enable_thinking false

CASES = [
    ("", "<think>\nplan it\n</think>\n\nHello!", ("\nplan it\n", "Hello!")),
    (QWEN_OPEN, "plan it\n</think>\n\nHello!", ("plan it\n", "Hello!")),
    (QWEN_OFF, "Hello <think> there", ("", "Hello <think> there")),
    ("", "Hello!", ("", "Hello!")),
    ("", "  Hi <think>x</think>", ("", "  Hi <think>x</think>")),  # a tag in the answer is text
    (QWEN_OPEN, "cut off while thin", ("cut off while thin", "")),   # max_tokens mid-thought
    ("", "<thi", ("", "<thi")),  # half a tag at the end of a reply is answer text
]


@pytest.mark.parametrize("prompt, text, want", CASES)
def test_whole_and_streamed_splits_agree(prompt, text, want):
    p = reasoning_parser("qwen3")
    assert p.split(text, prompt) == want
    for size in (1, 2, 3, 7):  # every way the stream may cut a tag
        s, thinking, answer = p.splitter(prompt), "", ""
        for i in range(0, len(text), size):
            a, b = s.feed(text[i:i + size])
            assert "<think" not in a + b or "<think>" in want[1]  # never half a tag out
            thinking, answer = thinking + a, answer + b
        a, b = s.finish()
        assert (thinking + a, answer + b) == want


def test_parser_choice():
    assert parser_for_template("{{ '<think>' }}{{ '</think>' }}").name == "qwen3"
    assert parser_for_template("{{ messages }}") is None and parser_for_template(None) is None
    with pytest.raises(ConfigError, match="--reasoning-parser r1: use one of qwen3, deepseek_r1"):
        reasoning_parser("r1")


@pytest.mark.parametrize("enable", [True, False])
def test_enable_thinking_renders_as_transformers(tmp_path, enable):
    transformers = pytest.importorskip("transformers")
    from astrai.data.tokenizer import Tokenizer

    d = family_dir("qwen3", tmp_path)
    ours = Tokenizer.load(d)
    theirs = transformers.AutoTokenizer.from_pretrained(d)
    msgs = [{"role": "user", "content": "Hi"}]
    want = theirs.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                      enable_thinking=enable)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    got = ours.encode_chat(msgs, extra={"enable_thinking": enable})
    assert got == list(want)
    text = ours.decode(got)
    assert reasoning_parser("qwen3").opens_thinking(text) is False  # Qwen3 opens it itself
    assert text.endswith("<think>\n\n</think>\n\n") is (not enable)
    # a variable the caller passes can never replace the template's own
    assert ours.encode_chat(msgs, extra={"messages": [], "add_generation_prompt": False}) == \
        ours.encode_chat(msgs)


class _Out:
    def __init__(self, text, finished=False):
        self.delta_text, self.finished = text, finished
        self.finish_reason = "stop" if finished else None
        self.error = None
        self.token_ids = [0]
        self.usage = SimpleNamespace(cached_tokens=0)
        self.metrics = SimpleNamespace(token_times=[0.0], ttft=0.01)


class _Engine:
    max_context = 4096

    def lora_names(self):
        return []


def test_chat_shows_thinking_apart_and_keeps_only_the_answer(tmp_path):
    """`astrai chat` on a thinking template: the thinking comes as Thinking deltas (dimmed by
    the CLI), the answer as text; the history keeps the answer; `/think off` renders Qwen3's
    empty thinking block into the prompt, `/think on` takes it out."""
    from astrai.data.tokenizer import Tokenizer
    from astrai.infer.chat_reply import Reply, Thinking
    from astrai.infer.chat_session import ChatSession

    session = ChatSession(_Engine(), Tokenizer.load(family_dir("qwen3", tmp_path)))
    assert session.reasoning is not None and session.think
    on = session.tokenizer.decode(session.encode([{"role": "user", "content": "Hi"}]))
    assert session.command("/think off").message == "thinking off"
    off = session.tokenizer.decode(session.encode([{"role": "user", "content": "Hi"}]))
    assert off.endswith("<think>\n\n</think>\n\n") and not on.endswith("</think>\n\n")
    assert session.command("/think maybe").error and session.command("/think on").message == \
        "thinking on"
    pieces = ["<thi", "nk>\nLet me", " see.</th", "ink>\n\nHel", "lo!"]
    stream = iter([_Out(p) for p in pieces[:-1]] + [_Out(pieces[-1], finished=True)])
    reply = Reply(session, stream, "Hi", 5, None, session.reasoning.splitter(on))
    deltas = [d for d in reply if d]
    thinking = "".join(d for d in deltas if isinstance(d, Thinking))
    answer = "".join(d for d in deltas if not isinstance(d, Thinking))
    assert (thinking, answer) == ("\nLet me see.", "Hello!")
    assert (reply.thinking, reply.text) == (thinking, answer)
    assert session.messages[-1] == {"role": "assistant", "content": "Hello!"}
