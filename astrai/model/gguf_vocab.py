"""A tokenizer directory as llama.cpp's GGUF tokenizer metadata (`tokenizer.ggml.*`).

Read from the files (astrai.model.tokenizer_files), never through the tokenizers library
(docs/architecture.md "Order of rooms"). Two tokenizer.json kinds map:

- byte-level BPE (GPT-2 / Llama 3 / Qwen2 / astrai's own) → model `gpt2`: tokens in their
  byte-level spelling (`Ġthe`), merges, and the pre-tokenizer llama.cpp should split text
  with (`tokenizer.ggml.pre`), recognised by its regex — llama.cpp's converter tells them
  apart by a hash of the tokens of a test text and names the same families;
- SentencePiece-style BPE with byte fallback (Llama 2, Mistral: `▁` for spaces, `<0xNN>`
  byte tokens) → model `llama`: tokens with scores, where a token's score is minus the rank
  of the first merge that makes it, so llama.cpp's best-score-first merging applies the
  merges in tokenizer.json's order.

Anything else (WordLevel, WordPiece, Unigram, an unknown pre-tokenizer) is one
UnsupportedModelError naming it: a GGUF that tokenizes differently would be silently wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from astrai.errors import UnsupportedModelError
from astrai.model.tokenizer_files import (
    END_OF_TURN,
    chat_template,
    special_token_ids,
    token_ids,
    tokenizer_config,
    tokenizer_json,
)

# llama.cpp token types (llama-vocab.h, gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

GPT2_REGEX = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
PRE_BY_REGEX = {
    # Llama 3 ("llama-bpe" in llama.cpp): digits in groups of up to three
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",
    # Qwen2 / Qwen2.5 / Qwen3: single digits
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
    GPT2_REGEX: "gpt-2",
}
"""A byte-level pre-tokenizer's split regex -> llama.cpp's `tokenizer.ggml.pre` name."""


@dataclass
class GGUFVocab:
    """The `tokenizer.ggml.*` values of one tokenizer, padded to the model's vocabulary."""

    model: str
    """`gpt2` (byte-level BPE) or `llama` (SentencePiece-style BPE)."""
    tokens: list[str]
    types: list[int]
    pre: str | None = None
    merges: list[str] = field(default_factory=list)
    scores: list[float] | None = None
    special: dict[str, int] = field(default_factory=dict)
    """bos / eos / pad / unk / eot -> id."""
    add_bos: bool = False
    add_eos: bool = False
    add_space_prefix: bool | None = None
    chat_template: str | None = None


def read_vocab(path: Path, vocab_size: int) -> GGUFVocab:
    """GGUF tokenizer metadata of the tokenizer in directory `path` for a model with
    `vocab_size` embeddings (ids the tokenizer lacks become `[PAD{id}]`)."""
    tok = tokenizer_json(path)
    if not tok:
        raise UnsupportedModelError(
            f"{path}: no readable tokenizer.json; a GGUF needs the tokenizer to run in "
            "llama.cpp, so export a checkpoint saved with its tokenizer")
    model = tok.get("model") or {}
    kind = _kind(tok, path)
    ids = token_ids(path)
    if ids and max(ids.values()) >= vocab_size:
        raise UnsupportedModelError(
            f"{path / 'tokenizer.json'}: has token id {max(ids.values())} but the model has "
            f"only {vocab_size} embeddings; export with the tokenizer the model was trained with")
    merges = [_merge(m) for m in model.get("merges") or []]
    tokens, types = _tokens(tok, ids, vocab_size, byte_level=kind == "gpt2")
    vocab = GGUFVocab(model=kind, tokens=tokens, types=types, chat_template=chat_template(path))
    if kind == "gpt2":
        vocab.pre, vocab.merges = _pre_name(tok, path), merges
    else:
        vocab.scores = _scores(tokens, merges)
        vocab.add_space_prefix = _space_prefix(tok)
    vocab.special = _special_ids(path, tok, ids)
    vocab.add_bos, vocab.add_eos = _adds(path, tok, vocab.special)
    return vocab


def _kind(tok: dict[str, Any], path: Path) -> str:
    model = tok.get("model") or {}
    mtype = model.get("type")
    if mtype != "BPE":
        raise UnsupportedModelError(
            f"{path / 'tokenizer.json'}: a {mtype} tokenizer has no GGUF tokenizer model astrai "
            "maps (byte-level BPE -> gpt2, SentencePiece-style BPE with byte fallback -> llama)")
    if _has(tok.get("pre_tokenizer"), "ByteLevel"):
        return "gpt2"
    if model.get("byte_fallback") and (_has(tok.get("pre_tokenizer"), "Metaspace")
                                        or _has(tok.get("normalizer"), "Prepend")):
        return "llama"
    raise UnsupportedModelError(
        f"{path / 'tokenizer.json'}: a BPE tokenizer neither byte-level nor SentencePiece-style "
        "(Metaspace / ▁ with byte fallback); GGUF export maps only those two")


def _has(node: Any, kind: str) -> bool:
    """Whether a normalizer / pre-tokenizer tree holds a component of type `kind`."""
    if isinstance(node, dict):
        return node.get("type") == kind or any(_has(v, kind) for v in node.values())
    if isinstance(node, list):
        return any(_has(v, kind) for v in node)
    return False


def _pre_name(tok: dict[str, Any], path: Path) -> str:
    """llama.cpp's pre-tokenizer name for a byte-level BPE's pre_tokenizer."""
    pre = tok.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    splits = [p for p in parts if isinstance(p, dict) and p.get("type") == "Split"]
    levels = [p for p in parts if isinstance(p, dict) and p.get("type") == "ByteLevel"]
    if len(parts) == 1 and levels and levels[0].get("use_regex", True):
        regex = GPT2_REGEX  # ByteLevel's built-in split is GPT-2's
    elif len(parts) == 2 and len(splits) == 1 and levels and not levels[0].get("use_regex", True):
        regex = (splits[0].get("pattern") or {}).get("Regex")
    else:
        regex = None
    if regex in PRE_BY_REGEX:
        return PRE_BY_REGEX[regex]
    raise UnsupportedModelError(
        f"{path / 'tokenizer.json'}: its pre_tokenizer is none llama.cpp's GGUF names map "
        f"(astrai recognises {', '.join(sorted(set(PRE_BY_REGEX.values())))}); llama.cpp "
        "would split text differently")


def _merge(m: Any) -> str:
    return " ".join(m) if isinstance(m, list) else str(m)


def _looks_special(t: str) -> bool:
    # the added tokens llama.cpp's converter marks as control even when not flagged special
    return ((t.startswith("<|") and t.endswith("|>")) or (t.startswith("<｜") and t.endswith("｜>"))
            or t.startswith(("<start_of_", "<end_of_")))


def _tokens(tok: dict[str, Any], ids: dict[str, int], vocab_size: int, byte_level: bool
            ) -> tuple[list[str], list[int]]:
    """Token text and llama.cpp type for every id below `vocab_size`."""
    reverse = {i: t for t, i in ids.items()}
    added = {a["id"]: a for a in tok.get("added_tokens", [])
             if isinstance(a, dict) and isinstance(a.get("id"), int)}
    unk = (tok.get("model") or {}).get("unk_token")
    tokens, types = [], []
    for i in range(vocab_size):
        t = reverse.get(i)
        if t is None:  # an embedding row no token uses (a vocabulary padded for speed)
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED if not byte_level else USER_DEFINED)
            continue
        tokens.append(t)
        if not byte_level and t == unk:
            types.append(UNKNOWN)
        elif i in added:
            types.append(CONTROL if added[i].get("special") or _looks_special(t)
                         else USER_DEFINED)
        elif not byte_level and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", t):
            types.append(BYTE)
        else:
            types.append(NORMAL)
    return tokens, types


def _scores(tokens: list[str], merges: list[str]) -> list[float]:
    """Minus the rank of the first merge making each token; 0 for tokens no merge makes
    (characters, bytes, specials), which are never the result of a merge step."""
    rank: dict[str, int] = {}
    for r, m in enumerate(merges):
        a, _, b = m.partition(" ")
        rank.setdefault(a + b, r)
    return [-float(rank[t]) if t in rank else 0.0 for t in tokens]


def _space_prefix(tok: dict[str, Any]) -> bool:
    """Whether the tokenizer puts `▁` before the text (Prepend normalizer or Metaspace)."""
    def walk(node: Any) -> bool:
        if isinstance(node, list):
            return any(walk(n) for n in node)
        if not isinstance(node, dict):
            return False
        if node.get("type") == "Prepend":
            return node.get("prepend") == "▁"
        if node.get("type") == "Metaspace":
            return (node.get("prepend_scheme") in ("always", "first")
                    or node.get("add_prefix_space") is True)
        return any(walk(v) for v in node.values())
    return walk(tok.get("normalizer")) or walk(tok.get("pre_tokenizer"))


def _special_ids(path: Path, tok: dict[str, Any], ids: dict[str, int]) -> dict[str, int]:
    named = special_token_ids(path)
    out = {k: named[f"{k}_token_id"] for k in ("bos", "eos", "pad") if f"{k}_token_id" in named}
    unk = (tok.get("model") or {}).get("unk_token")
    if isinstance(unk, str) and unk in ids:
        out["unk"] = ids[unk]
    eot = next((ids[t] for t in END_OF_TURN if t in ids), None)
    if eot is not None:
        out["eot"] = eot
    return out


def _template_ends(tok: dict[str, Any], ids: dict[str, int]) -> tuple[int | None, int | None]:
    """The ids of the special tokens tokenizer.json's post-processor puts before and after
    a single text (TemplateProcessing), None where it puts none."""
    proc = tok.get("post_processor") or {}
    procs = proc.get("processors", []) if proc.get("type") == "Sequence" else [proc]
    for p in procs:
        if isinstance(p, dict) and p.get("type") == "TemplateProcessing" and p.get("single"):
            first, last = p["single"][0], p["single"][-1]
            return (ids.get((first.get("SpecialToken") or {}).get("id")),
                    ids.get((last.get("SpecialToken") or {}).get("id")))
    return None, None


def _adds(path: Path, tok: dict[str, Any], special: dict[str, int]) -> tuple[bool, bool]:
    """(add_bos, add_eos): tokenizer_config.json's add_bos_token / add_eos_token, else
    whether the post-processor adds them; a token it prepends becomes bos when none is named."""
    cfg = tokenizer_config(path)
    head, tail = _template_ends(tok, token_ids(path))
    if head is not None:
        special.setdefault("bos", head)
    add_bos = cfg.get("add_bos_token")
    add_eos = cfg.get("add_eos_token")
    if not isinstance(add_bos, bool):
        add_bos = head is not None and head == special.get("bos")
    if not isinstance(add_eos, bool):
        add_eos = tail is not None and tail == special.get("eos") and tail != head
    return add_bos, add_eos
