"""A conversation -> token ids (+ loss mask): the one rule every chat path follows.

`conversation_ids` is what `astrai chat`, the engine's chat session, SFT / DPO / GRPO
preprocessing and online rollouts call to turn messages into ids. The ids equal Hugging Face
transformers' `tokenizer.apply_chat_template(messages, tokenize=True,
add_generation_prompt=...)` for the same tokenizer files:

1. Render the whole conversation once with the chat template (Jinja, sandboxed, as
   transformers does: `astrai.data.chat.render`).
2. Encode the rendered string once, with no special tokens added (the template writes BOS
   itself when the family wants one) — never message by message, since a BPE merge or a
   SentencePiece `▁` can cross a message boundary.
3. The loss mask comes from character spans: each trained message's content is located in
   the render, every token whose character offsets overlap it is trained, and so are the
   end-of-turn tokens (`<|im_end|>`, `<|eot_id|>`, `</s>`: the tokenizer's stop ids) the
   template emits right after it. Headers, generation prompts and separators are not.

Templates may rewrite earlier turns (Qwen3 drops `<think>` blocks before the last user
message, Llama 3 trims content): the content is looked for as written, then as the
template commonly rewrites it (trimmed, after `</think>`). A reply that cannot be located
raises a DataError naming the record. Multi-turn SFT records thus train the assistant spans of
the final render, as TRL's assistant-only loss does.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from astrai.data.chat import render
from astrai.errors import DataError

THINK_END = "</think>"


@dataclass(frozen=True)
class RenderedChat:
    """A conversation rendered by its chat template, with the character spans to train."""

    text: str
    """The render (what `apply_chat_template(..., tokenize=False)` returns)."""
    spans: tuple[tuple[int, int], ...]
    """[start, end) character spans of trained message contents, in order."""


@dataclass(frozen=True)
class ChatIds:
    """The ids of a conversation and its loss mask (1 = trained)."""

    ids: list[int]
    mask: list[int]
    text: str
    """The rendered conversation the ids encode."""


def _candidates(content: str) -> list[str]:
    """The content as written, then as templates commonly rewrite it."""
    out = [content]
    if THINK_END in content:  # Qwen3: earlier turns keep only what follows </think>
        out.append(content.split(THINK_END)[-1].lstrip("\n"))
    for c in list(out):
        out += [c.strip(), c.lstrip("\n"), c.strip("\n"), c.lstrip(), c.rstrip()]
    seen: list[str] = []
    for c in out:
        if c and c not in seen:
            seen.append(c)
    return seen


def _locate(text: str, content: str, start: int) -> tuple[int, int] | None:
    """The earliest occurrence at or after `start` of a candidate form of `content`
    (the longest candidate on ties); None when no form occurs."""
    best: tuple[int, int] | None = None
    for c in _candidates(content):
        i = text.find(c, start)
        if i >= 0 and (best is None or i < best[0] or (i == best[0] and i + len(c) > best[1])):
            best = (i, i + len(c))
    return best


def render_conversation(tokenizer, messages: Sequence[dict], *,
                        add_generation_prompt: bool = False,
                        train_roles: Collection[str] = ("assistant",), first_trained: int = 0,
                        where: str = "conversation", tools: Sequence[dict] | None = None,
                        extra: dict | None = None) -> RenderedChat:
    """Render `messages` (with `tools`, OpenAI's function list, when given) once and locate the content of each message whose role is in
    `train_roles` (messages before index `first_trained` are never trained: a DPO prompt).
    Raises ConfigError when the tokenizer has no chat template and DataError (naming
    `where`) when a trained message cannot be found in the render."""
    source = tokenizer.require_template()
    special = tokenizer.template_vars
    text = render(source, messages, add_generation_prompt=add_generation_prompt,
                  special=special, tools=tools, extra=extra)
    spans: list[tuple[int, int]] = []
    if not train_roles:
        return RenderedChat(text, ())
    cursor = 0
    for i, m in enumerate(messages):
        role, content = m.get("role"), m.get("content") or ""
        trained = role in train_roles and i >= first_trained
        start = cursor
        if role == "assistant":
            # Skip the assistant header: the render up to the generation prompt is a prefix
            # of the full render for every template that does not rewrite this turn's past.
            try:
                head = render(source, messages[:i], add_generation_prompt=True,
                              special=special, tools=tools, extra=extra) if i else ""
            except DataError:
                head = ""
            if head and text.startswith(head):
                start = max(start, len(head))
        if not content.strip():
            if trained:
                spans.append((start, start))  # an empty reply: only its end-of-turn trains
            continue
        found = _locate(text, content, start)
        if found is None:
            if trained:
                raise DataError(
                    f"{where}: message {i} ({role}) cannot be located in the chat template's "
                    "render (the template rewrites it), so its loss mask is unknown; fix or "
                    "drop the record, or pass --on-error skip")
            continue
        cursor = found[1]
        if trained:
            spans.append(found)
    return RenderedChat(text, tuple(spans))


def mask_from_offsets(ids: Sequence[int], offsets: Sequence[tuple[int, int]],
                      spans: Sequence[tuple[int, int]], end_ids: Collection[int]) -> list[int]:
    """1 for each token overlapping a span, and for the end-of-turn ids right after it.

    An empty span (an empty reply) trains the first end-of-turn token at or after it."""
    mask = [0] * len(ids)
    k, n = 0, len(ids)
    for s, e in spans:
        if s == e:
            while k < n and offsets[k][0] < s:
                k += 1
            while k < n and ids[k] not in end_ids:
                k += 1
        else:
            while k < n and offsets[k][1] <= s:
                k += 1
            while k < n and offsets[k][0] < e:  # overlaps [s, e)
                mask[k] = 1
                k += 1
        while k < n and ids[k] in end_ids:
            mask[k] = 1
            k += 1
    return mask


def mask_from_encoding(enc, spans: Sequence[tuple[int, int]], end_ids: Collection[int]
                       ) -> list[int]:
    """`mask_from_offsets` for a `tokenizers.Encoding`, looking up only the spans' ends
    (`char_to_token`) instead of every token's offsets."""
    ids = enc.ids
    n = len(ids)
    mask = [0] * n
    k = 0
    for s, e in spans:
        a = enc.char_to_token(s)
        b = enc.char_to_token(e - 1) if s < e else a
        if a is None or b is None:  # a character no token covers (a normalizer dropped it)
            return mask_from_offsets(ids, enc.offsets, spans, end_ids)
        if s == e:  # an empty reply: its first end-of-turn token
            while a < n and ids[a] not in end_ids:
                a += 1
            b = a - 1
        else:  # byte fallback / byte-level pieces of one character share its offsets
            while b + 1 < n and (c := enc.token_to_chars(b + 1)) is not None and c[0] < e:
                b += 1
        a, k = max(a, k), max(b + 1, k)
        mask[a:k] = [1] * (k - a)
        while k < n and ids[k] in end_ids:
            mask[k] = 1
            k += 1
    return mask


def conversation_ids(tokenizer, messages: Sequence[dict], *, add_generation_prompt: bool = False,
                     train_roles: Collection[str] = ("assistant",), first_trained: int = 0,
                     where: str = "conversation", tools: Sequence[dict] | None = None,
                     extra: dict | None = None) -> ChatIds:
    """The token ids of `messages` (= transformers' `apply_chat_template(messages,
    tokenize=True, add_generation_prompt=..., tools=...)`) and the loss mask training on the content of
    `train_roles` messages plus the end-of-turn tokens after each.

    `add_generation_prompt=True` gives the prompt a model answers (chat, GRPO, rollouts);
    False the full record (SFT, DPO). Raises ConfigError when the tokenizer has no chat
    template (`--chat-template NAME|FILE`) and DataError when a trained message cannot be
    located in the render."""
    rc = render_conversation(tokenizer, messages, add_generation_prompt=add_generation_prompt,
                             train_roles=train_roles, first_trained=first_trained,
                             where=where, tools=tools, extra=extra)
    (enc,) = tokenizer.encode_encodings([rc.text])
    return ChatIds(enc.ids, mask_from_encoding(enc, rc.spans, set(tokenizer.stop_ids)), rc.text)
