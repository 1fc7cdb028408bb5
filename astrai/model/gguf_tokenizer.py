"""A GGUF file's tokenizer metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`) as a
tokenizer.json document and the special tokens around it — the reverse of gguf_vocab.

Plain data: the data room turns it into astrai's Tokenizer (`Tokenizer.from_gguf`), as it
does a tokenizer directory (docs/architecture.md, "Order of rooms"). Two GGUF tokenizer
models map, as in transformers' GGUF loader (`integrations/gguf`) and llama.cpp's
llama-vocab:

- `gpt2`: byte-level BPE — the tokens (already in the byte-level spelling), the merges, and
  the split regex of `tokenizer.ggml.pre` (llama.cpp names the pre-tokenizer, not its regex);
- `llama`: SentencePiece-style BPE with byte fallback (`▁` for spaces, `<0xNN>` bytes); a
  GGUF holds scores, not merges, so the merges are recovered from the vocabulary: every
  split of a token into two tokens, best score first (llama.cpp merges by score).

Control tokens become special added tokens, user-defined ones plain added tokens, so both
stay whole as llama.cpp keeps them. Anything else (another model, an unknown pre-tokenizer,
a gpt2 file without merges) is one UnsupportedModelError naming the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from astrai.errors import CheckpointError, UnsupportedModelError
from astrai.model.gguf_file import GGUFFile, open_gguf
from astrai.model.gguf_vocab import CONTROL, GPT2_REGEX, PRE_BY_REGEX, USER_DEFINED

SPLITS = {name: regex for regex, name in PRE_BY_REGEX.items()}
SPLITS.update({"llama3": SPLITS["llama-bpe"], "llama-v3": SPLITS["llama-bpe"],
               "smaug-bpe": SPLITS["llama-bpe"], "deepseek-r1-qwen": SPLITS["qwen2"],
               "default": GPT2_REGEX})
"""llama.cpp's `tokenizer.ggml.pre` name -> the split regex its llama-vocab applies."""
IGNORE_MERGES = ("llama-bpe", "llama3", "llama-v3", "smaug-bpe")
"""Pre-tokenizers whose words already in the vocabulary skip merging (Llama 3's
tokenizer.json `ignore_merges`, llama.cpp's `ignore_merges` for these types)."""
_PAD = re.compile(r"^\[PAD\d+\]$")  # the filler rows of a padded vocabulary (gguf_vocab)


@dataclass
class GGUFTokenizer:
    """What astrai's Tokenizer needs: the tokenizer.json document and its special tokens."""

    document: dict[str, Any]
    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    chat_template: str | None = None
    stop_ids: list[int] = field(default_factory=list)
    """End-of-turn ids beside eos (`eot_token_id`, `eom_token_id`)."""


def read_gguf_tokenizer(path: Any) -> GGUFTokenizer:
    """The tokenizer of GGUF file `path`."""
    from gguf import Keys

    g = open_gguf(path)
    kind = g.value(Keys.Tokenizer.MODEL)
    tokens = g.value(Keys.Tokenizer.LIST)
    if kind is None or not isinstance(tokens, list) or not tokens:
        raise UnsupportedModelError(f"{g.path}: no tokenizer in the metadata "
                                    "(tokenizer.ggml.model, tokenizer.ggml.tokens); "
                                    "re-convert it with its tokenizer")
    types = g.value(Keys.Tokenizer.TOKEN_TYPE) or [1] * len(tokens)
    if len(types) != len(tokens):
        raise CheckpointError(f"{g.path}: tokenizer.ggml.token_type has {len(types)} entries "
                              f"for {len(tokens)} tokens; the file is corrupt, re-convert it")
    if kind == "gpt2":
        doc = _byte_level(g, tokens)
    elif kind == "llama":
        doc = _sentencepiece(g, tokens, types)
    else:
        raise UnsupportedModelError(f"{g.path}: GGUF tokenizer model {kind!r} is not one astrai "
                                    "reads (gpt2: byte-level BPE, llama: SentencePiece BPE)")
    doc["added_tokens"] = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": ty == CONTROL}
        for i, (t, ty) in enumerate(zip(tokens, types))
        if ty == CONTROL or (ty == USER_DEFINED and not _PAD.match(t))]
    return _specials(g, tokens, doc)


def _id_of(g: GGUFFile, key: str, tokens: list[str]) -> int | None:
    i = g.number(key)
    if i is not None and not 0 <= i < len(tokens):
        raise CheckpointError(f"{g.path}: {key} is {i}, outside the {len(tokens)} tokens; the "
                              "file is corrupt, re-convert it")
    return i


def _specials(g: GGUFFile, tokens: list[str], doc: dict[str, Any]) -> GGUFTokenizer:
    """bos / eos / pad names, BOS added when `add_bos_token` says so, the template."""
    from gguf import Keys

    T = Keys.Tokenizer
    bos, eos, pad = (_id_of(g, k, tokens) for k in (T.BOS_ID, T.EOS_ID, T.PAD_ID))
    stops = [i for k in (T.EOT_ID, T.EOM_ID) if (i := _id_of(g, k, tokens)) is not None]
    add_bos = g.value(T.ADD_BOS) is True and bos is not None
    if add_bos:
        special = {"id": tokens[bos], "type_id": 0}
        doc["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": special}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": special}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": special}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {tokens[bos]: {"id": tokens[bos], "ids": [bos],
                                             "tokens": [tokens[bos]]}}}
    template = g.value(T.CHAT_TEMPLATE)
    name = (lambda i: None if i is None else tokens[i])
    return GGUFTokenizer(doc, bos_token=name(bos), eos_token=name(eos), pad_token=name(pad),
                         chat_template=template if isinstance(template, str) else None,
                         stop_ids=stops)


def _byte_level(g: GGUFFile, tokens: list[str]) -> dict[str, Any]:
    from gguf import Keys

    merges = g.value(Keys.Tokenizer.MERGES)
    if not isinstance(merges, list) or not merges:
        raise UnsupportedModelError(
            f"{g.path}: a gpt2 (byte-level BPE) tokenizer without tokenizer.ggml.merges; "
            "astrai cannot tokenize without them, re-convert the file with llama.cpp's "
            "convert_hf_to_gguf.py")
    pre = g.value(Keys.Tokenizer.PRE) or "default"
    if pre not in SPLITS:
        raise UnsupportedModelError(
            f"{g.path}: tokenizer.ggml.pre {pre!r} is not a pre-tokenizer astrai knows "
            f"({', '.join(sorted(SPLITS))}); it would split text differently from llama.cpp")
    split = [{"type": "Split", "pattern": {"Regex": SPLITS[pre]}, "behavior": "Isolated",
              "invert": False}]
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}
    return {"version": "1.0", "truncation": None, "padding": None, "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": split + [level]},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                        "use_regex": False},
            "model": _bpe(tokens, [m.split(" ", 1) for m in merges],
                          ignore_merges=pre in IGNORE_MERGES)}


def _bpe(tokens: list[str], merges: list[list[str]], **extra: Any) -> dict[str, Any]:
    return {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False, **extra,
            "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges}


def _sentencepiece(g: GGUFFile, tokens: list[str], types: list[int]) -> dict[str, Any]:
    """SentencePiece BPE as Llama 2 / Mistral's tokenizer.json spells it."""
    from gguf import Keys

    scores = g.value(Keys.Tokenizer.SCORES)
    if not isinstance(scores, list) or len(scores) != len(tokens):
        raise UnsupportedModelError(f"{g.path}: a llama (SentencePiece) tokenizer without one "
                                    "tokenizer.ggml.scores entry per token; astrai cannot "
                                    "recover its merges, re-convert the file")
    unk = g.number(Keys.Tokenizer.UNK_ID)
    prefix = g.value(Keys.Tokenizer.ADD_PREFIX)
    normal = [{"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]
    if prefix is not False:
        normal.insert(0, {"type": "Prepend", "prepend": "\u2581"})
    decoder = [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
               {"type": "ByteFallback"}, {"type": "Fuse"}]
    if prefix is not False:
        decoder.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    unk_token = tokens[unk] if unk is not None and 0 <= unk < len(tokens) else None
    return {"version": "1.0", "truncation": None, "padding": None,
            "normalizer": {"type": "Sequence", "normalizers": normal}, "pre_tokenizer": None,
            "post_processor": None, "decoder": {"type": "Sequence", "decoders": decoder},
            "model": _bpe(tokens, _merges_from_scores(tokens, scores, types),
                          unk_token=unk_token, fuse_unk=True, byte_fallback=True)}


def _merges_from_scores(tokens: list[str], scores: list[float], types: list[int]
                        ) -> list[list[str]]:
    """Every split of a normal token into two tokens, highest score of the result first
    (ties: the pieces' ids), as SentencePiece's BPE applies them."""
    ids = {t: i for i, t in enumerate(tokens)}
    found = []
    for i, t in enumerate(tokens):
        if types[i] != 1 or len(t) < 2:  # 1: NORMAL (controls, bytes never merge)
            continue
        for k in range(1, len(t)):
            a, b = t[:k], t[k:]
            if a in ids and b in ids:
                found.append((-float(scores[i]), ids[a], ids[b], a, b))
    found.sort()
    return [[a, b] for _, _, _, a, b in found]
