"""What `astrai tokenizer info` reports: special tokens, stop ids, the chat template, warnings."""

from __future__ import annotations

import re
from typing import Any

from astrai.data.chat_templates import NAMED_TEMPLATES
from astrai.data.tokenizer import Tokenizer

# Role and turn markers templates write as literal strings; each should be one token.
_MARKER = re.compile(r"<\|[^|'\"\s]+\|>|\[/?INST\]|<</?SYS>>|<(?:start|end)_of_turn>")


def template_name(template: str | None) -> str:
    """'none', a NAMED_TEMPLATES name when the text is one of them, else 'custom'."""
    if template is None:
        return "none"
    return next((n for n, t in NAMED_TEMPLATES.items() if t == template), "custom")


def template_warnings(tok: Tokenizer) -> list[str]:
    """Problems a chat user hits: no template, markers that split, no pad token."""
    out = []
    if tok.chat_template is None:
        out.append("no chat template: chat and SFT refuse it; pass --chat-template "
                   "NAME|FILE (" + ", ".join(NAMED_TEMPLATES) + ") or --no-template")
    else:
        for marker in sorted(set(_MARKER.findall(tok.chat_template))):
            n = len(tok.encode(marker))
            if n != 1:
                out.append(f"template marker {marker} is not one token ({n} pieces): the "
                           "model sees it as text; choose a template of this family")
    if tok.pad_token is None or tok.token_to_id(tok.pad_token) is None:
        out.append(f"no pad token: batches are padded with id {tok.pad_id} (masked)")
    return out


def tokenizer_info(tok: Tokenizer) -> dict[str, Any]:
    """A JSON-ready summary of `tok` (what `astrai tokenizer info --json` prints)."""
    return {
        "path": str(tok.path), "vocab_size": tok.vocab_size, "fingerprint": tok.fingerprint(),
        "bos": [tok.bos_token, tok.bos_id], "eos": [tok.eos_token, tok.eos_id],
        "pad": [tok.pad_token, tok.pad_id], "stop_ids": tok.stop_ids,
        "stop_tokens": [tok.id_to_token(i) for i in tok.stop_ids],
        "special_tokens": {str(i): tok.id_to_token(i) for i in sorted(tok.special_ids)},
        "template": template_name(tok.chat_template),
        "chat_template": tok.chat_template,
        "warnings": template_warnings(tok),
    }
