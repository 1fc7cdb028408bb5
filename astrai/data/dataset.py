"""Datasets per kind over a dataset directory, and their collate functions.

Samples (all int64 unless noted; see docs/formats.md):
* pretrain: input_ids [T], target_ids [T] (next token; -100 at each document's last token,
  so targets never cross documents), doc_ids [T] (document index in the packed row),
  position_ids [T] (absent when the dataset was built with position_ids "none").
* sft: the same plus loss_mask [T], aligned with target_ids (1 where target_ids is trained;
  target_ids is -100 wherever loss_mask is 0).
* dpo: chosen [Tc], rejected [Tr], chosen_mask [Tc], rejected_mask [Tr]; mask[i] = 1 when
  token i is a response token (its log-prob counts); prompt and padding are 0.
* grpo online: prompts [P] (chat-rendered, ending with the generation prompt), reference
  (str, "" when the record had none).
* grpo offline: prompts [P], responses [G, R], masks [G, R] (1 on response tokens),
  rewards [G] (float32).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from astrai.data.manifest import dataset_tokenizer_dir, read_manifest
from astrai.data.packing import IGNORE, doc_ids, position_ids, shifted_targets
from astrai.data.store import H5Store, MmapStore, ShardedStore
from astrai.errors import DataError


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, dtype=np.int64))


class ShardDataset(Dataset):
    """Base: a split of a dataset directory; `collate` batches its samples."""

    def __init__(self, root: str | Path, split: str = "train", shared: bool = False) -> None:
        self.root = Path(root)
        self.manifest = read_manifest(self.root)
        self.kind: str = self.manifest["kind"]
        splits = self.manifest["splits"]
        if split not in splits:
            raise DataError(f"{self.root}: no '{split}' split (has: {', '.join(splits)}); "
                            "add val_inputs to the spec for a held-out split")
        self.split = split
        keys: dict[str, str] = self.manifest["keys"]
        shards = []
        for sh in splits[split]["shards"]:
            path = self.root / sh["path"]
            if self.manifest["format"] == "h5":
                shards.append(H5Store(path, list(keys), shared=shared))
            else:
                shards.append(MmapStore(path, keys))
        self.store = ShardedStore(shards)
        tok = self.manifest["tokenizer"]
        self.pad_id: int = tok["pad_id"]
        self.vocab_size: int = tok["vocab_size"]
        self.fingerprint: str = tok["fingerprint"]
        self.seq_len: int = int(self.manifest.get("row_len") or self.manifest["max_seq_len"])
        """Longest row (pretrain/sft) or sequence (dpo, grpo prompts) in tokens."""

    @property
    def tokenizer_dir(self) -> Path:
        return dataset_tokenizer_dir(self.root)

    def __len__(self) -> int:
        return len(self.store)

    def _get(self, key: str, i: int) -> np.ndarray:
        return self.store.get(key, i)

    def collate(self, batch: list[dict]) -> dict[str, Any]:
        return make_collate(self.kind, self.pad_id)(batch)


class PackedDataset(ShardDataset):
    """pretrain and sft rows: packed documents with shifted targets."""

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        toks = self._get("input_ids", i)
        lens = self._get("doc_lens", i)
        mask = self._get("loss_mask", i) if self.manifest["has_loss_mask"] else None
        tgt = shifted_targets(toks, lens, mask)
        out = {"input_ids": _t(toks), "target_ids": torch.from_numpy(tgt),
               "doc_ids": torch.from_numpy(doc_ids(lens))}
        pos = position_ids(lens, self.manifest["position_ids"])
        if pos is not None:
            out["position_ids"] = torch.from_numpy(pos)
        if self.kind == "sft":
            out["loss_mask"] = (out["target_ids"] != IGNORE).long()
        return out


class DPODataset(ShardDataset):
    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: _t(self._get(k, i)) for k in ("chosen", "rejected", "chosen_mask",
                                                 "rejected_mask")}


class GRPODataset(ShardDataset):
    @property
    def offline(self) -> bool:
        return self.manifest.get("grpo_mode") == "offline"

    def __getitem__(self, i: int) -> dict[str, Any]:
        out: dict[str, Any] = {"prompts": _t(self._get("prompts", i))}
        if not self.offline:
            out["reference"] = self._get("reference", i).tobytes().decode("utf-8")
            return out
        lens = self._get("response_lens", i).astype(np.int64)
        flat, m = self._get("responses", i), self._get("masks", i)
        G, R = len(lens), int(lens.max())
        resp = np.full((G, R), self.pad_id, dtype=np.int64)
        masks = np.zeros((G, R), dtype=np.int64)
        starts = np.cumsum(lens) - lens
        for g in range(G):
            resp[g, : lens[g]] = flat[starts[g]: starts[g] + lens[g]]
            masks[g, : lens[g]] = m[starts[g]: starts[g] + lens[g]]
        out.update(responses=torch.from_numpy(resp), masks=torch.from_numpy(masks),
                   rewards=torch.from_numpy(self._get("rewards", i).astype(np.float32)))
        return out


_KINDS = {"pretrain": PackedDataset, "sft": PackedDataset, "dpo": DPODataset,
          "grpo": GRPODataset}


def open_dataset(root: str | Path, split: str | None = None, *, shared: bool = False
                 ) -> ShardDataset:
    """The torch Dataset of `split` ("train" by default, or "val") of a dataset directory.

    shared: read HDF5 shards into shared memory so DataLoader workers share one copy.
    """
    kind = read_manifest(root)["kind"]
    return _KINDS[kind](root, split or "train", shared=shared)


# ---- collate ----------------------------------------------------------------------------
def pad_1d(seqs: list[torch.Tensor], value: float, length: int | None = None,
           left: bool = False) -> torch.Tensor:
    """Stack 1-D tensors into [B, length] (default: the longest), padding with `value`."""
    T = length or max((len(s) for s in seqs), default=0)
    out = torch.full((len(seqs), T), value, dtype=seqs[0].dtype if seqs else torch.long)
    for b, s in enumerate(seqs):
        s = s[:T]
        if left:
            out[b, T - len(s):] = s
        else:
            out[b, : len(s)] = s
    return out


def _round_up(n: int, multiple: int | None) -> int:
    return n if not multiple else -(-n // multiple) * multiple


_PACKED_PAD = {"input_ids": None, "target_ids": IGNORE, "position_ids": 0, "doc_ids": -1,
               "loss_mask": 0}


def _collate_packed(batch: list[dict], pad_id: int, multiple: int | None) -> dict:
    T = _round_up(max(len(s["input_ids"]) for s in batch), multiple)
    return {k: pad_1d([s[k] for s in batch], pad_id if v is None else v, T)
            for k, v in _PACKED_PAD.items() if k in batch[0]}


def _collate_dpo(batch: list[dict], pad_id: int, multiple: int | None) -> dict:
    # chosen and rejected share one length so a strategy can run them as one [2B, T] batch
    T = _round_up(max(max(len(s["chosen"]), len(s["rejected"])) for s in batch), multiple)
    return {k: pad_1d([s[k] for s in batch], pad_id if k in ("chosen", "rejected") else 0, T)
            for k in ("chosen", "rejected", "chosen_mask", "rejected_mask")}


def _collate_grpo(batch: list[dict], pad_id: int, multiple: int | None) -> dict:
    prompts = [s["prompts"] for s in batch]
    P = _round_up(max(len(p) for p in prompts), multiple)
    # left padding: prompt tokens end where generation starts, in every row
    out: dict[str, Any] = {
        "prompts": pad_1d(prompts, pad_id, P, left=True),
        "prompt_mask": pad_1d([torch.ones(len(p), dtype=torch.long) for p in prompts], 0, P,
                              left=True),
    }
    if "reference" in batch[0]:
        out["reference"] = [s["reference"] for s in batch]
        return out
    R = max(s["responses"].shape[1] for s in batch)
    G = batch[0]["responses"].shape[0]
    out["responses"] = torch.full((len(batch), G, R), pad_id, dtype=torch.long)
    out["masks"] = torch.zeros((len(batch), G, R), dtype=torch.long)
    for b, s in enumerate(batch):
        r = s["responses"].shape[1]
        out["responses"][b, :, :r] = s["responses"]
        out["masks"][b, :, :r] = s["masks"]
    out["rewards"] = torch.stack([s["rewards"] for s in batch])  # [B, G]
    return out


def make_collate(kind: str, pad_id: int, pad_to_multiple: int | None = None
                 ) -> Callable[[list[dict]], dict]:
    """Collate for `kind`: pads (input ids with pad_id, targets -100, masks and positions 0,
    doc_ids -1) to the longest sample, rounded up to `pad_to_multiple`, and stacks."""
    fn = {"pretrain": _collate_packed, "sft": _collate_packed, "dpo": _collate_dpo,
          "grpo": _collate_grpo}[kind]
    return partial(fn, pad_id=pad_id, multiple=pad_to_multiple)


def collate_for(kind: str, pad_id: int = 0, pad_to_multiple: int | None = None
                ) -> Callable[[list[dict]], dict]:
    """`make_collate` with a default pad id (padding is never trained on; any id works for
    pretrain/sft/dpo, while grpo prompts should use the dataset's pad id)."""
    return make_collate(kind, pad_id, pad_to_multiple)
