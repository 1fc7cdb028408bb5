"""Chat messages to prompt ids: the one seam between the server and the chat-template rule.

The ids are those `astrai chat` feeds the model and SFT trains on (the tokenizer's
`encode_chat`, equal to transformers' `apply_chat_template(..., add_generation_prompt=True)`).
The server never renders templates itself: when that rule moves, only this call changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def chat_prompt_ids(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    """The prompt ids of a chat ending where the assistant's reply begins."""
    return list(tokenizer.encode_chat(list(messages), add_generation_prompt=True))
