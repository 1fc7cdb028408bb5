"""Data: tokenizer + chat templates, preprocessing (spec -> shards), datasets, sampler.

Names are imported lazily so that tokenization workers never import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Tokenizer": "astrai.data.tokenizer",
    "StreamDecoder": "astrai.data.detokenize",
    "conversation_ids": "astrai.data.chat_ids",
    "ChatIds": "astrai.data.chat_ids",
    "NAMED_TEMPLATES": "astrai.data.chat_templates",
    "train_tokenizer": "astrai.data.bpe",
    "SpecialTokens": "astrai.data.bpe",
    "build_dataset": "astrai.data.builder",
    "BuildResult": "astrai.data.builder",
    "open_dataset": "astrai.data.dataset",
    "make_collate": "astrai.data.dataset",
    "read_manifest": "astrai.data.manifest",
    "dataset_tokenizer_dir": "astrai.data.manifest",
    "RDSampler": "astrai.data.rdsampler",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'astrai.data' has no attribute {name!r}")
