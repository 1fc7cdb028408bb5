"""A multi-turn chat over the Engine, with slash commands; no terminal I/O (the CLI does that).

    session = open_chat("runs/x/checkpoints/step_100", params=SamplingParams(max_tokens=256))
    reply = session.reply("Hello")       # iterate it for text deltas; reply.cancel() stops it
    for piece in reply: print(piece, end="")
    session.command("/set temperature 0.2")

History is a list of user/assistant messages (the system prompt is kept apart). Before each
reply the whole conversation is rendered by the chat template and encoded once
(`astrai.data.chat_ids.conversation_ids`, the ids transformers' `apply_chat_template` gives);
templates that rewrite earlier turns (Qwen3) are rendered afresh each turn, and the radix
cache reuses whatever prefix of the previous turn's ids still matches, so only the rest is
prefilled (`/stats` shows how many tokens came from the cache). When the prompt would leave
less than `reply_room` tokens of the context, the oldest turns (a user message and its
reply) are dropped and the reply carries a notice saying so.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astrai.errors import CheckpointError, ConfigError, DataError
from astrai.infer.build import EngineOptions
from astrai.infer.chat_input import collect_message  # noqa: F401 (the CLI's import)
from astrai.infer.chat_reply import Reply, ReplyStats, speculation_line
from astrai.infer.params import SamplingParams
from astrai.infer.reasoning import parser_for_template
from astrai.model.gguf_file import is_gguf

SETTABLE: dict[str, type] = {
    "temperature": float, "top_p": float, "top_k": int, "min_p": float, "max_tokens": int,
    "seed": int, "repetition_penalty": float, "frequency_penalty": float,
    "presence_penalty": float,
}
"""Sampling settings `/set KEY VALUE` may change (seed also takes 'none')."""

HELP = """commands:
  /set KEY VALUE   change a sampling setting ({keys}); /set alone shows them
  /system TEXT     set the system prompt (/system alone clears it); history is kept
  /reset           forget the conversation (the system prompt stays)
  /lora NAME       reply with the LoRA adapter NAME (given with --lora); /lora none: the
                   base; /lora alone lists them (/adapter is the same)
  /think on|off    let a thinking model (Qwen3-style template) think before answering
  /stats           tokens/s and time to first token of the last reply
  /help            this text
  /exit            leave (also /quit or Ctrl-D)
  //TEXT           send TEXT beginning with '/'"""


@dataclass
class CommandResult:
    """What a slash command did: a message to show, and whether to leave the chat."""

    message: str = ""
    error: bool = False
    exit: bool = False


class ChatSession:
    def __init__(self, engine: Any, tokenizer: Any, params: SamplingParams | None = None, *,
                 system: str | None = None, template: bool = True,
                 reply_room: int | None = None) -> None:
        """`template`: False for base models (the conversation is one running text).
        `reply_room`: context tokens kept free for the reply; None = min(max_tokens, half
        the context)."""
        self.engine = engine
        self.tokenizer = tokenizer
        self.params = params or SamplingParams()
        self.system = system or None
        self.template = template
        if template:
            tokenizer.require_template()  # a base model's tokenizer: say so before any turn
        self.reply_room = reply_room
        self.messages: list[dict[str, str]] = []
        """User and assistant turns, oldest first (no system message)."""
        self.last: ReplyStats | None = None
        self.max_context: int = engine.max_context
        names = engine.lora_names()
        self.lora: str | None = names[0] if names else None
        """The adapter replies run under (the first --lora; None: the base)."""
        self.reasoning = (parser_for_template(getattr(tokenizer, "chat_template", None))
                          if template else None)
        """Splits a thinking model's thinking from its answer (None: the template does not
        think)."""
        self.think = True
        """Let a thinking model think (the template's enable_thinking; `/think off`)."""
        self._prompt = ""

    # -- prompts ---------------------------------------------------------------------------
    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        """The prompt ids for `messages` (ending with the new user message)."""
        if self.template:
            from astrai.data.chat_ids import conversation_ids

            sys = [{"role": "system", "content": self.system}] if self.system else []
            extra = None if self.reasoning is None else {"enable_thinking": self.think}
            chat = conversation_ids(self.tokenizer, sys + messages, add_generation_prompt=True,
                                    extra=extra)
            self._prompt = chat.text
            return chat.ids
        # Base model: one running text; each input starts a new line, each reply continues
        # its input directly.
        parts = [self.system] if self.system else []
        for m in messages:
            parts.append(("\n" if parts and m["role"] == "user" else "") + m["content"])
        return self.tokenizer.encode("".join(parts), add_special_tokens=True)

    def _room(self) -> int:
        if self.reply_room is not None:
            return self.reply_room
        return min(self.params.max_tokens, self.max_context // 2)

    def fit(self, user: str) -> tuple[list[int], int]:
        """(prompt ids, turns dropped): drop the oldest turns until the prompt leaves room
        for the reply. Raises DataError when the new message alone is too long."""
        limit = max(self.max_context - self._room(), 1)
        dropped = 0
        while True:
            msgs = self.messages + [{"role": "user", "content": user}]
            ids = self.encode(msgs)
            if len(ids) <= limit:
                return ids, dropped
            if not self.messages:
                raise DataError(
                    f"the message is {len(ids)} tokens but the context holds {self.max_context} "
                    f"with {self._room()} kept for the reply: shorten it or lower max_tokens")
            # A turn is a user message and the reply that follows it.
            cut = 2 if len(self.messages) > 1 and self.messages[1]["role"] == "assistant" else 1
            del self.messages[:cut]
            dropped += 1

    # -- replies ---------------------------------------------------------------------------
    def reply(self, user: str) -> Reply:
        """Start the reply to `user` (generation runs as the Reply is iterated)."""
        ids, dropped = self.fit(user)
        notice = None
        if dropped:
            turns = "turn" if dropped == 1 else f"{dropped} turns"
            notice = f"the context is full: dropped the oldest {turns}"
        stream = self.engine.generate(ids, self.params, stream=True, lora=self.lora)
        split = None if self.reasoning is None else self.reasoning.splitter(self._prompt)
        return Reply(self, stream, user, len(ids), notice, split)

    def _record(self, reply: Reply) -> None:
        self.messages.append({"role": "user", "content": reply.user})
        self.messages.append({"role": "assistant", "content": reply.text})
        self.last = reply.stats()

    # -- commands --------------------------------------------------------------------------
    @staticmethod
    def is_command(line: str) -> bool:
        return line.startswith("/") and not line.startswith("//")

    @staticmethod
    def unescape(line: str) -> str:
        """'//text' sends '/text'."""
        return line[1:] if line.startswith("//") else line

    def command(self, line: str) -> CommandResult:
        name, _, arg = line.strip().partition(" ")
        arg = arg.strip()
        name = name.lower()
        if name in ("/exit", "/quit", "/bye"):
            return CommandResult(exit=True)
        if name == "/help":
            return CommandResult(HELP.format(keys=", ".join(SETTABLE)))
        if name in ("/reset", "/clear"):
            n = len(self.messages) // 2
            self.messages.clear()
            return CommandResult(f"conversation reset ({n} turn{'s' if n != 1 else ''} "
                                 "forgotten)")
        if name == "/system":
            self.system = arg or None
            return CommandResult("system prompt set" if arg else "system prompt cleared")
        if name == "/stats":
            if self.last is None:
                return CommandResult("no reply yet")
            return CommandResult(self.last.describe() + f"; decode path: "
                                 f"{self.engine.stats().decode}" + speculation_line(self.engine))
        if name == "/set":
            return self._set(arg)
        if name in ("/lora", "/adapter"):
            return self._lora(arg)
        if name == "/think":
            return self._think(arg)
        return CommandResult(f"unknown command {name}: type /help", error=True)

    def _lora(self, arg: str) -> CommandResult:
        names = self.engine.lora_names()
        if not arg:
            listed = ", ".join(names) if names else "none (give --lora NAME=DIR)"
            return CommandResult(f"adapter: {self.lora or 'none (the base)'}; served: {listed}")
        if arg.lower() == "none":
            self.lora = None
            return CommandResult("replies use the base model")
        if arg not in names:
            return CommandResult(f"/lora {arg}: not served; use one of "
                                 f"{', '.join(names) or 'none (give --lora NAME=DIR)'}",
                                 error=True)
        self.lora = arg
        return CommandResult(f"replies use the adapter {arg}")

    def _think(self, arg: str) -> CommandResult:
        if self.reasoning is None:
            return CommandResult("/think: this model's chat template does not think (no "
                                 "<think> block)", error=True)
        if arg.lower() not in ("on", "off", ""):
            return CommandResult(f"/think {arg}: use /think on or /think off", error=True)
        if arg:
            self.think = arg.lower() == "on"
        return CommandResult(f"thinking {'on' if self.think else 'off'}")

    def settings(self) -> dict[str, Any]:
        return {k: getattr(self.params, k) for k in SETTABLE}

    def _set(self, arg: str) -> CommandResult:
        if not arg:
            return CommandResult("  ".join(f"{k}={v}" for k, v in self.settings().items()))
        key, _, raw = arg.partition(" ")
        key, raw = key.strip().lower().replace("-", "_"), raw.strip()
        if key not in SETTABLE:
            return CommandResult(f"/set {key}: unknown setting; use one of "
                                 f"{', '.join(SETTABLE)}", error=True)
        if not raw:
            return CommandResult(f"/set {key}: give a value, e.g. /set {key} "
                                 f"{getattr(self.params, key)}", error=True)
        try:
            value: Any = None if key == "seed" and raw.lower() == "none" else SETTABLE[key](raw)
        except ValueError:
            kind = "an integer" if SETTABLE[key] is int else "a number"
            return CommandResult(f"/set {key} {raw}: must be {kind}", error=True)
        try:
            self.params = dataclasses.replace(self.params, **{key: value})
        except ConfigError as e:  # "sampling top_p=2.0: must be in (0, 1]" -> the why
            return CommandResult(f"/set {key} {raw}: {str(e).partition(': ')[2]}",
                                 error=True)
        return CommandResult(f"{key} = {value}")


def open_chat(path: str | Path, options: EngineOptions | None = None, *,
              params: SamplingParams | None = None, system: str | None = None,
              template: bool = True, chat_template: str | None = None,
              backend: str | None = None, max_context: int | None = None) -> ChatSession:
    """A ChatSession on a checkpoint directory (astrai or HF) holding its tokenizer.

    `options`: how the model loads and decodes (astrai.infer.build.EngineOptions: device,
    dtype, a merged `adapter`, `quantize`, `decode`, `speculative`, and `loras` served
    unmerged, the first one replying until `/lora` switches); `chat_template`: a template
    name (chatml, llama3, qwen2.5, mistral, llama2) or .jinja file replacing the
    tokenizer's own; `template=False` chats with a base model."""
    from astrai.infer.build import build_engine, load_weights
    from astrai.infer.config import CacheConfig
    from astrai.infer.loading import load_tokenizer

    options = options or EngineOptions()
    options.validate_engine()
    path = Path(path)
    if not path.is_dir() and not is_gguf(path):
        raise CheckpointError(f"{path}: not a checkpoint directory or .gguf file")
    params = params or SamplingParams()  # (bad sampling values failed when it was built)
    if not is_gguf(path) and not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: not a checkpoint (no config.json); point to an astrai "
                              "checkpoint (RUN_DIR/checkpoints/step_N) or a HF model directory")
    tok = load_tokenizer(path)
    if tok is None:
        raise CheckpointError(
            f"{path} has no tokenizer.json: chat needs the tokenizer the model was trained "
            f"with; copy it in (e.g. cp DATASET_DIR/tokenizer*.json {path}/)")
    if chat_template is not None:
        from astrai.data.chat_templates import resolve_template

        tok.chat_template = resolve_template(chat_template)
    if template:
        tok.require_template()  # before the weights load
    model = load_weights(path, options)
    ctx = model.config.max_seq_len if max_context is None else max_context
    page = 16
    # Room for two conversations' worth of pages: the previous turn stays in the radix
    # cache while the next one (which extends it) is prefilled.
    cache = CacheConfig.from_dict(dict(page_size=page, max_kv_tokens=2 * (ctx + page),
                                       max_requests=4, max_context=max_context))
    engine = build_engine(model, tok, options, cache, backend=backend)
    return ChatSession(engine, tok, params, system=system, template=template)
