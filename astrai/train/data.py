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
    """A dataset directory of `astrai preprocess` as TrainData. Validation data: eval_path,
    else the last val_split of the training samples, else the dataset's own `val` split."""
    from astrai.data.dataset import collate_for, open_dataset
    from astrai.data.manifest import read_manifest

    root = Path(path)
    if not root.is_dir():
        raise DataError(f"data: {root} is not a directory; pass a dataset written by "
                        "`astrai preprocess`")
    train = open_dataset(root)
    samples, eval_set = train, None
    if eval_path is not None:
        eval_set = open_dataset(Path(eval_path))  # its main split, all held out
        if eval_set.kind != train.kind:
            raise DataError(f"eval_data: {eval_path} is a {eval_set.kind} dataset but {path} "
                            f"is {train.kind}; validate on the same kind")
        if eval_set.fingerprint != train.fingerprint:
            raise DataError(f"eval_data: {eval_path} was tokenized with another tokenizer "
                            f"than {path}; preprocess both with the same tokenizer")
    elif val_split:
        samples, eval_set = hold_out(train, val_split)
    elif "val" in read_manifest(root)["splits"]:
        eval_set = open_dataset(root, "val")
    collate = collate_for(train.kind, train.pad_id)
    seq_len = train.seq_len
    if window_size is not None and window_size != seq_len:
        if window_size > seq_len:
            raise ConfigError(f"window_size {window_size} exceeds the dataset's row length "
                              f"{seq_len}; preprocess with a longer max_seq_len")
        collate, seq_len = crop(collate, window_size), window_size
    return TrainData(
        dataset=samples, kind=train.kind,
        seq_len=seq_len, collate_fn=collate, vocab_size=train.vocab_size,
        tokenizer_dir=train.tokenizer_dir, fingerprint=train.fingerprint,
        eval_dataset=eval_set, path=str(root),
    )

