"""Chat messages to prompt ids: the one seam between the server and the chat-template rule.

The ids are those `astrai chat` feeds the model and SFT trains on (`conversation_ids`,
equal to transformers' `apply_chat_template(..., add_generation_prompt=True, tools=...)`).
The server never renders templates itself: when that rule moves, only this call changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from astrai.data.chat_ids import conversation_ids


def chat_prompt_ids(tokenizer: Any, messages: Sequence[dict[str, Any]],
                    tools: Sequence[dict] | None = None) -> list[int]:
    """The prompt ids of a chat (with `tools`, OpenAI's function list, when given) ending
    where the assistant's reply begins. No loss mask is needed, so no reply is located."""
    return list(conversation_ids(tokenizer, list(messages), add_generation_prompt=True,
                                 train_roles=(), tools=tools).ids)
