"""Bits per byte: a tokenizer-independent validation loss.

bpb = (sum of token NLLs in nats) / ln 2 / (UTF-8 bytes those tokens decode to). It needs the
byte length of every token id: for byte-level BPE each character of a token string stands
for exactly one byte (GPT-2's bytes_to_unicode map); special tokens stand for no text.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import decoders


def _byte_level_chars() -> set[str]:
    # GPT-2's printable stand-ins for the 256 byte values (Radford et al. 2019, encoder.py).
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {chr(b) for b in keep}, 0
    for b in range(256):
        if b not in keep:
            chars.add(chr(256 + extra))
            extra += 1
    return chars


def token_byte_lengths(tokenizer_dir: str | Path) -> torch.Tensor:
    """[V] int64: UTF-8 bytes each token id stands for (0 for special tokens)."""
    from astrai.data.tokenizer import Tokenizer

    tok = Tokenizer.load(tokenizer_dir)
    backend = tok.backend
    V = backend.get_vocab_size(with_added_tokens=True)
    special = set(tok.special_ids)
    byte_level = isinstance(backend.decoder, decoders.ByteLevel)
    stand_ins = _byte_level_chars() if byte_level else set()
    out = torch.zeros(V, dtype=torch.int64)
    for i in range(V):
        if i in special:
            continue
        s = backend.id_to_token(i)
        if s is None:
            continue
        if byte_level and all(c in stand_ins for c in s):
            out[i] = len(s)
        else:
            out[i] = len(backend.decode([i], skip_special_tokens=False).encode("utf-8"))
    return out
