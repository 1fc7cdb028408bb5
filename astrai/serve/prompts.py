"""Chat messages to prompt ids: the one seam between the server and the chat-template rule.

The ids are those `astrai chat` feeds the model and SFT trains on (`conversation_ids`,
equal to transformers' `apply_chat_template(..., add_generation_prompt=True, tools=...)`):
the conversation rendered by `render_conversation`, then encoded whole with no special
tokens added. The server never renders templates itself: when that rule moves, only this
call changes. The render is encoded by a batch call, which the HF tokenizers library runs
without the GIL (and without the character offsets no loss mask here needs), after a
render longer than the context could take is refused (limits.max_prompt_chars).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from astrai.data.chat_ids import render_conversation
from astrai.serve.errors import bad_request


def chat_prompt_ids(tokenizer: Any, messages: Sequence[dict[str, Any]],
                    tools: Sequence[dict] | None = None, max_chars: int | None = None
                    ) -> list[int]:
    """The prompt ids of a chat (`chat_prompt`'s ids)."""
    return chat_prompt(tokenizer, messages, tools, max_chars)[0]


def chat_prompt(tokenizer: Any, messages: Sequence[dict[str, Any]],
                tools: Sequence[dict] | None = None, max_chars: int | None = None,
                extra: dict[str, Any] | None = None) -> tuple[list[int], str]:
    """(ids, text) of the prompt of a chat (with `tools`, OpenAI's function list, and
    `extra` template variables, when given) ending where the assistant's reply begins; a
    400 naming `messages` when the render is longer than `max_chars`. No loss mask is
    needed, so no reply is located."""
    rc = render_conversation(tokenizer, list(messages), add_generation_prompt=True,
                             train_roles=(), tools=tools, extra=extra)
    if max_chars is not None and len(rc.text) > max_chars:
        raise bad_request(f"the conversation renders to {len(rc.text)} characters; this "
                          f"model's context takes at most {max_chars} (its context times its "
                          "longest token's characters): shorten the messages", "messages",
                          "context_length_exceeded")
    return list(tokenizer.encode_batch([rc.text])[0]), rc.text
