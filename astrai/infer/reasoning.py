"""Reasoning output: a thinking model's `<think>…</think>` text told apart from its answer.

    parser = reasoning_parser("qwen3")              # or parser_for_template(template)
    split = parser.splitter(prompt_text)            # one per reply
    for delta in reply: thinking, answer = split.feed(delta)
    thinking, answer = split.finish()

Qwen3 and DeepSeek-R1 write their thinking between `<think>` and `</think>` (vLLM's and
SGLang's `qwen3` / `deepseek_r1` reasoning parsers, llama.cpp's `--reasoning-format`). Where
the reply starts inside the thinking depends on the template: DeepSeek-R1's generation prompt
ends with `<think>\\n` (the reply starts thinking, without the opening tag), Qwen3's model
writes `<think>` itself, and Qwen3 with `enable_thinking: false` ends the prompt with an empty
`<think>\\n\\n</think>\\n\\n` (the reply is all answer). So a splitter starts inside the
thinking exactly when the prompt it continues ends inside an open block — one rule for every
template. Text that may be the start of a tag split across deltas is held back until the
next delta decides it (a stream never shows half a tag).
"""

from __future__ import annotations

from dataclasses import dataclass

from astrai.errors import ConfigError

PARSERS = {"qwen3": ("<think>", "</think>"), "deepseek_r1": ("<think>", "</think>")}
"""Parser name -> (opening tag, closing tag)."""


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    start: str
    end: str

    def opens_thinking(self, prompt: str) -> bool:
        """Whether a reply to `prompt` starts inside a thinking block (the prompt's last
        opening tag is not closed after it)."""
        i = prompt.rfind(self.start)
        return i >= 0 and prompt.find(self.end, i + len(self.start)) < 0

    def splitter(self, prompt: str = "", *, opened: bool | None = None) -> ReasoningSplitter:
        """A splitter for one reply to `prompt` (or starting inside a thinking block as
        `opened` says, when the caller read the prompt already)."""
        return ReasoningSplitter(self, self.opens_thinking(prompt) if opened is None
                                 else opened)

    def split(self, text: str, prompt: str = "") -> tuple[str, str]:
        """(thinking, answer) of a whole reply."""
        return self.splitter(prompt).take(text, last=True)


def reasoning_parser(name: str) -> ReasoningParser:
    """The parser `name` (PARSERS); a ConfigError naming the choices otherwise."""
    if name not in PARSERS:
        raise ConfigError(f"--reasoning-parser {name}: use one of {', '.join(PARSERS)} (or "
                          "none)")
    return ReasoningParser(name, *PARSERS[name])


def parser_for_template(template: str | None) -> ReasoningParser | None:
    """The parser a chat template calls for: one that writes `<think>` and `</think>` (Qwen3,
    DeepSeek-R1 and their fine-tunes) gets the tags' parser; None otherwise."""
    if not template or "<think>" not in template or "</think>" not in template:
        return None
    return reasoning_parser("qwen3")


class ReasoningSplitter:
    """One reply's incremental split (ReasoningParser.splitter). Before the answer begins,
    text that may still become an opening tag (whitespace, a tag's first characters) is held;
    once the answer has begun, a tag in it is text. The whitespace between a thinking block
    and the answer is dropped, as the templates put it there."""

    def __init__(self, parser: ReasoningParser, thinking: bool) -> None:
        self.parser = parser
        self.thinking = thinking
        """Inside a thinking block now."""
        self.thought = thinking
        """A thinking block was seen."""
        self.started = False
        """The answer has begun."""
        self._held = ""

    def feed(self, delta: str) -> tuple[str, str]:
        """(thinking, answer) text of `delta`, less what is held back (the class docstring)."""
        text, self._held = self._held + delta, ""
        think, answer = [], []
        start, end = self.parser.start, self.parser.end
        while text:
            if self.thinking:
                i = text.find(end)
                if i < 0:
                    keep = _partial_tail(text, end)
                    think.append(text[:len(text) - keep])
                    self._held = text[len(text) - keep:]
                    break
                think.append(text[:i])
                self.thinking, text = False, text[i + len(end):]
            elif self.started:
                answer.append(text)
                break
            else:
                t = text.lstrip()
                if start.startswith(t):  # whitespace, or the first characters of a tag
                    self._held = text
                    break
                if t.startswith(start):
                    self.thinking = self.thought = True
                    text = t[len(start):]
                    continue
                self.started = True
                answer.append(t if self.thought else text)
                break
        return "".join(think), "".join(answer)

    def take(self, delta: str, last: bool) -> tuple[str, str]:
        """`feed(delta)`, and with `last` (the reply's final delta) what was held back."""
        thinking, answer = self.feed(delta)
        if last:
            more = self.finish()
            thinking, answer = thinking + more[0], answer + more[1]
        return thinking, answer

    def finish(self) -> tuple[str, str]:
        """What was held back, once the reply is over."""
        held, self._held = self._held, ""
        if self.thinking:
            return held, ""
        return "", ("" if self.thought else held)
def _partial_tail(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
