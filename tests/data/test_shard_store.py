"""Shards: h5 and bin give identical samples; splitting at max_tokens_per_shard; dtypes."""

import json

import numpy as np
import pytest
import torch

from astrai.data.builder import build_dataset
from astrai.data.dataset import open_dataset
from astrai.data.store import H5Store, MmapStore, ShardWriter


def same(a, b):
    assert len(a) == len(b)
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]) if torch.is_tensor(x[k]) else x[k] == y[k], k


@pytest.mark.parametrize("kind,inputs", [
    ("pretrain", ["shakespeare_val.jsonl"]), ("sft", ["sft_val.jsonl"]),
    ("dpo", ["dpo_val.jsonl"]), ("grpo", ["grpo_offline_val.jsonl"])])
def test_h5_and_bin_give_identical_samples(spec_for, tmp_path, examples, kind, inputs):
    outs = {}
    for fmt in ("h5", "bin"):
        spec = spec_for(kind, [examples / i for i in inputs], format=fmt, max_seq_len=256,
                        output=str(tmp_path / fmt))
        build_dataset(spec)
        outs[fmt] = open_dataset(tmp_path / fmt)
    same(outs["h5"], outs["bin"])
    assert len(outs["h5"]) > 0


def test_shards_split_at_max_tokens(spec_for, tmp_path, examples):
    src = [examples / "shakespeare_val.jsonl"]
    one = spec_for("pretrain", src, max_seq_len=128, output=str(tmp_path / "one"))
    build_dataset(one)
    many = spec_for("pretrain", src, max_seq_len=128, max_tokens_per_shard=1000,
                    format="bin", output=str(tmp_path / "many"))
    res = build_dataset(many)
    shards = res.splits["train"].shards
    assert len(shards) > 10
    assert all(s["tokens"] <= 1000 for s in shards)
    assert sum(s["samples"] for s in shards) == res.splits["train"].samples
    manifest = json.loads((tmp_path / "many" / "manifest.json").read_text())
    assert [s["path"] for s in manifest["splits"]["train"]["shards"]][:2] == [
        "train/shard_00000", "train/shard_00001"]
    # reading across shard boundaries gives the same samples as one shard
    same(open_dataset(tmp_path / "one"), open_dataset(tmp_path / "many"))


def test_uint16_when_vocab_fits(spec_for, tmp_path, examples):
    build_dataset(spec_for("sft", [examples / "sft_val.jsonl"]))
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["token_dtype"] == "uint16" and m["keys"]["input_ids"] == "uint16"


@pytest.mark.parametrize("fmt", ["h5", "bin"])
def test_writer_round_trips_uint32_and_empty_samples(tmp_path, fmt):
    dtypes = {"input_ids": "uint32", "rewards": "float32"}
    path = tmp_path / ("s.h5" if fmt == "h5" else "s")
    w = ShardWriter(path, fmt, dtypes)
    samples = [{"input_ids": np.array([70000, 1, 4_000_000_000]), "rewards": np.array([0.5])},
               {"input_ids": np.array([], dtype=np.int64), "rewards": np.array([1.0, -2.0])}]
    for s in samples:
        w.add(s)
    w.close()
    store = H5Store(path, list(dtypes)) if fmt == "h5" else MmapStore(path, dtypes)
    assert len(store) == 2
    for i, s in enumerate(samples):
        for k, dt in dtypes.items():
            np.testing.assert_array_equal(store.get(k, i), s[k].astype(dt))


def test_h5_shared_memory_reads_the_same(spec_for, tmp_path, examples):
    build_dataset(spec_for("pretrain", [examples / "shakespeare_val.jsonl"], max_seq_len=128))
    same(open_dataset(tmp_path / "out"), open_dataset(tmp_path / "out", shared=True))
