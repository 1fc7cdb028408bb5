"""A tokenizer directory's JSON files read as files: the ids of its special tokens.

Exporters (HF, GGUF) need a few facts of the tokenizer — which ids are bos, eos and pad,
which end a reply — without loading the tokenizers library (the data room's job:
astrai.data.tokenizer); these functions read tokenizer.json, tokenizer_config.json and
generation_config.json directly, and give {} / [] for files that are missing or unreadable.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>")
"""Tokens that end an assistant turn in common templates; generation stops on any present."""


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def tokenizer_json(path: Path) -> dict[str, Any]:
    """`path`/tokenizer.json as a dict ({} when missing or unreadable)."""
    return _read(path / "tokenizer.json")


def tokenizer_config(path: Path) -> dict[str, Any]:
    """`path`/tokenizer_config.json as a dict ({} when missing or unreadable)."""
    return _read(path / "tokenizer_config.json")


def chat_template(path: Path) -> str | None:
    """The chat template as astrai's tokenizer loader finds it: chat_template.jinja, else
    tokenizer_config.json's "chat_template" (of a list of named templates, "default")."""
    try:
        return (path / "chat_template.jinja").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        pass
    value = tokenizer_config(path).get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default") or next(iter(named.values()), None)
    return value if isinstance(value, str) else None


def token_ids(path: Path) -> dict[str, int]:
    """Token string -> id over tokenizer.json's vocabulary and added tokens."""
    tok = _read(path / "tokenizer.json")
    vocab = (tok.get("model") or {}).get("vocab")
    ids = dict(vocab) if isinstance(vocab, dict) else {}
    for t in tok.get("added_tokens", []):
        if isinstance(t, dict) and isinstance(t.get("id"), int):
            ids[t.get("content")] = t["id"]
    return {k: v for k, v in ids.items() if isinstance(k, str) and isinstance(v, int)}


def special_token_ids(path: Path) -> dict[str, int]:
    """bos/eos/pad token ids named by tokenizer_config.json and resolved in tokenizer.json
    (keys bos_token_id, eos_token_id, pad_token_id; absent when not named or not found)."""
    cfg = _read(path / "tokenizer_config.json")
    ids = token_ids(path) if cfg else {}
    out: dict[str, int] = {}
    for key in ("bos", "eos", "pad"):
        token = cfg.get(f"{key}_token")
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str) and token in ids:
            out[f"{key}_token_id"] = ids[token]
    return out


def stop_token_ids(path: Path) -> list[int]:
    """The ids that end a reply: eos, the end-of-turn markers present (e.g. <|im_end|>) and
    generation_config.json's eos ids, eos first, each once; [] without a tokenizer.json."""
    ids = token_ids(path)
    if not ids:
        return []
    eos = special_token_ids(path).get("eos_token_id")
    gen = _read(path / "generation_config.json").get("eos_token_id")
    extra = [gen] if isinstance(gen, int) else [i for i in gen or [] if isinstance(i, int)]
    out: list[int] = []
    for i in [eos, *(ids.get(t) for t in END_OF_TURN), *extra]:
        if i is not None and i not in out:
            out.append(i)
    return out
