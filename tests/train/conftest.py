"""Synthetic in-memory datasets and a tiny model for trainer tests (CPU, fp32, seconds)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import Dataset

from astrai.config.train import TrainConfig
from astrai.train.data import TrainData

VOCAB = 64
TINY = {"dim": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "head_dim": 16,
        "ffn_dim": 64, "max_seq_len": 64}


class ListDataset(Dataset):
    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def pretrain_samples(n: int, T: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Rows of a noisy repeating pattern (learnable), targets shifted by one."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        start = int(torch.randint(0, VOCAB, (1,), generator=g))
        seq = (start + torch.arange(T + 1) * 3) % VOCAB
        noise = torch.rand(T + 1, generator=g) < 0.1
        seq = torch.where(noise, torch.randint(0, VOCAB, (T + 1,), generator=g), seq)
        out.append({"input_ids": seq[:-1].clone(), "target_ids": seq[1:].clone(),
                    "position_ids": torch.arange(T), "doc_ids": torch.zeros(T, dtype=torch.long)})
    return out


def sft_samples(n: int, T: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Packed rows of 1-3 documents with uneven response masks (loss_mask on targets)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        seq = torch.randint(0, VOCAB, (T + 1,), generator=g)
        n_docs = int(torch.randint(1, 4, (1,), generator=g))
        cuts = sorted(torch.randperm(T - 1, generator=g)[: n_docs - 1].add(1).tolist())
        bounds = [0, *cuts, T]
        doc_ids = torch.zeros(T, dtype=torch.long)
        pos = torch.zeros(T, dtype=torch.long)
        mask = torch.zeros(T, dtype=torch.long)
        for d, (a, b) in enumerate(itertools.pairwise(bounds)):
            doc_ids[a:b] = d
            pos[a:b] = torch.arange(b - a)
            prompt = int(torch.randint(0, max(1, b - a), (1,), generator=g))
            mask[a + prompt:b] = 1
        target = seq[1:].clone()
        target[mask == 0] = -100
        out.append({"input_ids": seq[:-1].clone(), "target_ids": target, "position_ids": pos,
                    "doc_ids": doc_ids, "loss_mask": mask})
    return out


def collate(samples):
    return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}


def make_data(kind: str = "pretrain", n: int = 32, T: int = 16, seed: int = 0,
              eval_n: int = 0) -> TrainData:
    make = pretrain_samples if kind == "pretrain" else sft_samples
    ev = ListDataset(make(eval_n, T, seed + 1)) if eval_n else None
    return TrainData(dataset=ListDataset(make(n, T, seed)), kind=kind, seq_len=T,
                     collate_fn=collate, vocab_size=VOCAB, eval_dataset=ev,
                     )


def make_config(tmp_path, **kw) -> TrainConfig:
    base = {"strategy": "seq", "model": "tiny", "model_overrides": TINY,
            "out": str(tmp_path / "run"), "batch_size": 4, "max_lr": 1e-2, "warmup_steps": 1,
            "ckpt_interval": 0, "peak_tflops": 1.0, "device": "cpu"}
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs on one torch thread (tests/conftest.py)."""


@pytest.fixture
def tiny_config(tmp_path):
    return lambda **kw: make_config(tmp_path, **kw)
