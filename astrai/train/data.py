"""The training side of a dataset directory: samples, kind, length, collate, tokenizer.

Everything the trainer needs from `astrai.data` passes through `TrainData`, so tests can
hand the trainer an in-memory dataset and the trainer never reaches into shard formats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, Subset

from astrai.errors import ConfigError, DataError


@dataclass
class TrainData:
    dataset: Dataset
    """Training samples: dicts of 1-D tensors."""
    kind: str
    """Manifest kind: pretrain, sft, dpo, grpo."""
    seq_len: int
    """Tokens per row fed to the model."""
    collate_fn: Callable[[list[dict[str, torch.Tensor]]], dict[str, torch.Tensor]]
    vocab_size: int
    """Ids of the dataset's tokenizer (a model needs at least this many rows)."""
    tokenizer_dir: Path | None = None
    """Copied into every checkpoint, so chat can open it."""
    fingerprint: str | None = None
    eval_dataset: Dataset | None = None
    path: str = "<memory>"
    sampler_fn: Callable[..., Any] | None = None
    """(length, seed, rank, world_size) -> resumable sampler; None = astrai's RDSampler."""


def crop(collate: Callable, window: int) -> Callable:
    """Cut every [B, T] tensor of a batch to its first `window` positions."""

    def collate_cropped(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        batch = collate(samples)
        return {k: v[:, :window] if torch.is_tensor(v) and v.dim() == 2 else v
                for k, v in batch.items()}

    return collate_cropped


def hold_out(dataset: Dataset, fraction: float) -> tuple[Dataset, Dataset]:
    """(train, validation): the last `fraction` of the samples become validation (a fixed
    split, independent of the seed, so resumes and reruns validate on the same rows)."""
    n = len(dataset)
    n_val = max(1, round(n * fraction))
    if n_val >= n:
        raise ConfigError(f"val_split {fraction}: the dataset has only {n} samples")
    return Subset(dataset, range(n - n_val)), Subset(dataset, range(n - n_val, n))


def open_train_data(path: str, *, window_size: int | None = None,
                    eval_path: str | None = None, val_split: float = 0.0) -> TrainData:
    """A dataset directory of `astrai preprocess` as TrainData (its val split, if any,
    becomes the validation set unless eval_path or val_split say otherwise)."""
    from astrai.data import dataset as ds
    from astrai.data.tokenizer import Tokenizer

    root = Path(path)
    if not root.is_dir():
        raise DataError(f"data: {root} is not a directory; pass a dataset written by "
                        "`astrai preprocess`")
    train = ds.open_dataset(root)
    info = _describe(train, root)
    tok_dir = Path(ds.dataset_tokenizer_dir(root))
    tok = Tokenizer.load(tok_dir)
    eval_set = None
    if eval_path is not None:
        eval_set = ds.open_dataset(Path(eval_path))
        other = _describe(eval_set, Path(eval_path))
        if other["kind"] != info["kind"]:
            raise DataError(f"eval_data: {eval_path} is a {other['kind']} dataset but "
                            f"{path} is {info['kind']}; validate on the same kind")
        theirs = Tokenizer.load(ds.dataset_tokenizer_dir(Path(eval_path))).fingerprint()
        if theirs != tok.fingerprint():
            raise DataError(f"eval_data: {eval_path} was tokenized with another tokenizer "
                            f"than {path}")
    elif val_split:
        train, eval_set = hold_out(train, val_split)
    else:
        eval_set = _val_split(ds, root)
    seq_len = info["seq_len"]
    collate = info["collate_fn"]
    if window_size is not None:
        if window_size > seq_len:
            raise ConfigError(f"window_size {window_size} exceeds the dataset's row length "
                              f"{seq_len}; preprocess with a longer max_seq_len")
        collate, seq_len = crop(collate, window_size), window_size
    return TrainData(dataset=train, kind=info["kind"], seq_len=seq_len, collate_fn=collate,
                     vocab_size=tok.vocab_size, tokenizer_dir=tok_dir,
                     fingerprint=tok.fingerprint(), eval_dataset=eval_set, path=str(root))


def _describe(dataset: Any, root: Path) -> dict[str, Any]:
    from astrai.data import dataset as ds

    kind = getattr(dataset, "kind", None)
    seq_len = getattr(dataset, "seq_len", None)
    if kind is None or seq_len is None:
        raise DataError(f"data: {root}: dataset does not report its kind / row length")
    return {"kind": kind, "seq_len": int(seq_len), "collate_fn": ds.collate_for(kind)}


def _val_split(ds: Any, root: Path) -> Dataset | None:
    try:
        return ds.open_dataset(root, split="val")
    except (DataError, FileNotFoundError, KeyError, TypeError):
        return None
