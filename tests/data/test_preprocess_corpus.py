"""Corpus-scale preprocessing: Parquet / zstd / gzip inputs, workers, shards and merge."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from astrai.data import sources
from astrai.data.builder import build_dataset, parse_shard
from astrai.data.dataset import open_dataset
from astrai.data.merge import merge_datasets
from astrai.data.testing import tiny_corpus_path
from astrai.errors import ConfigError, DataError

SFT = Path(__file__).resolve().parents[2] / "examples" / "data" / "sft_train.jsonl"


def _paragraphs(n: int = 60) -> list[dict]:
    paras = [p for p in tiny_corpus_path().read_text(encoding="utf-8").split("\n\n")
             if len(p) >= 50]
    return [{"text": p, "id": i} for i, p in enumerate(paras[:n])]


def _chats(n: int = 80) -> list[dict]:
    lines = SFT.read_text(encoding="utf-8").splitlines()[:n]
    return [json.loads(line) for line in lines]


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _parquet(path: Path, records: list[dict], row_group_size: int = 16) -> Path:
    pq.write_table(pa.Table.from_pylist(records), path, row_group_size=row_group_size)
    return path


def _files(root: Path) -> dict[str, bytes]:
    """Every file of a dataset by relative path (the manifest without its timestamp)."""
    out = {}
    for f in sorted(root.rglob("*")):
        if f.is_file():
            data = f.read_bytes()
            if f.name == "manifest.json":
                m = json.loads(data)
                m.pop("created")
                m["spec"].pop("inputs")
                m["spec"].pop("output")
                data = json.dumps(m, sort_keys=True).encode()
            out[f.relative_to(root).as_posix()] = data
    return out


def _samples(root: Path, split: str = "train") -> list[dict]:
    ds = open_dataset(root, split)
    return [{k: v.tolist() for k, v in ds[i].items()} for i in range(len(ds))]


@pytest.mark.parametrize("kind", ["pretrain", "sft"])
def test_parquet_zst_gz_give_the_jsonl_dataset(kind, spec_for, tmp_path):
    recs = _paragraphs() if kind == "pretrain" else _chats()
    raw = _jsonl(tmp_path / "c.jsonl", recs).read_bytes()
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    _parquet(tmp_path / "c.parquet", recs)
    extra = {"max_seq_len": 256, "packing": {"mode": "bfd"}, "format": "bin"}
    outs = {}
    for name in ("c.jsonl", "c.jsonl.gz", "c.jsonl.zst", "c.parquet"):
        out = tmp_path / f"out-{name}"
        res = build_dataset(spec_for(kind, [tmp_path / name], output=str(out), **extra))
        assert res.splits["train"].records_read == len(recs)
        outs[name] = _files(out)
    ref = outs.pop("c.jsonl")
    assert any(k.endswith("input_ids.bin") for k in ref)
    for name, files in outs.items():
        assert files == ref, name


def test_directory_input_and_parquet_nulls(spec_for, tmp_path):
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    recs = _paragraphs(20)
    _jsonl(d / "a.jsonl", recs[:10])
    _parquet(d / "sub" / "b.parquet", [*recs[10:], {"text": None, "id": 99}])
    (d / "notes.txt").write_text("not a corpus file")
    res = build_dataset(spec_for("pretrain", [d], packing={"mode": "none"},
                                 output=str(tmp_path / "o")), on_error="skip")
    st = res.splits["train"]
    assert (st.records_read, st.records_kept, st.malformed) == (21, 20, 1)
    assert "b.parquet:row 11: missing field 'text'" in res.errors[0]


def test_workers_1_and_2_are_byte_identical(spec_for, tmp_path, monkeypatch):
    monkeypatch.setattr("astrai.data.workers.CHUNK_LINES", 16)  # many chunks in flight
    p = _parquet(tmp_path / "c.parquet", _chats(300), row_group_size=40)
    files = []
    for w in (1, 2):
        out = tmp_path / f"w{w}"
        build_dataset(spec_for("sft", [p], output=str(out), format="h5", max_seq_len=128,
                               packing={"mode": "bfd"}), workers=w)
        files.append(_files(out))
    assert files[0] == files[1]


@pytest.mark.parametrize("parts", [["a", "b", "c"], ["big"]])
def test_three_shards_merged_equal_the_unsharded_build(parts, spec_for, tmp_path):
    recs = _paragraphs(60)
    if parts == ["big"]:  # one file: shards by row group
        inputs = [_parquet(tmp_path / "big.parquet", recs, row_group_size=7)]
    else:
        inputs = [_jsonl(tmp_path / f"{p}.jsonl", recs[i * 20:(i + 1) * 20])
                  for i, p in enumerate(parts)]
    val = _jsonl(tmp_path / "val.jsonl", recs[:5])

    def spec(out):
        return spec_for("pretrain", inputs, val_inputs=[str(val)], output=str(out),
                        max_seq_len=64, packing={"mode": "none"}, format="bin")

    whole = build_dataset(spec(tmp_path / "whole"))
    shards = [tmp_path / f"shard-{i}" for i in range(3)]
    for i, d in enumerate(shards):
        build_dataset(spec(d), shard=(i, 3))
    assert "val" not in json.loads((shards[1] / "manifest.json").read_text())["splits"]
    res = merge_datasets(list(reversed(shards)), tmp_path / "merged")  # any order
    assert res.linked > 0 and res.copied == 0
    for split in ("train", "val"):
        assert _samples(tmp_path / "merged", split) == _samples(tmp_path / "whole", split)
    m = json.loads((tmp_path / "merged" / "manifest.json").read_text())
    for k in ("records_read", "samples", "tokens"):
        assert m["splits"]["train"][k] == getattr(whole.splits["train"], k)
    assert (tmp_path / "merged" / "tokenizer" / "tokenizer.json").is_file()
    # the merged dataset holds its own names for the data: the shards may go
    for d in shards:
        for f in d.rglob("*.bin"):
            f.unlink()
    assert len(open_dataset(tmp_path / "merged")) == whole.splits["train"].samples


def test_merged_dataset_trains_like_the_unsharded_one(spec_for, tmp_path, one_thread):
    """Training reads the samples, so the same samples in the same order train the same."""
    recs = _paragraphs(30)
    inputs = [_jsonl(tmp_path / f"{i}.jsonl", recs[i * 10:(i + 1) * 10]) for i in range(3)]

    def spec(out):
        return spec_for("pretrain", inputs, output=str(out), max_seq_len=64,
                        packing={"mode": "none"}, format="h5")

    build_dataset(spec(tmp_path / "whole"))
    for i in range(3):
        build_dataset(spec(tmp_path / f"s{i}"), shard=(i, 3))
    merge_datasets([tmp_path / f"s{i}" for i in range(3)], tmp_path / "merged")
    a, b = open_dataset(tmp_path / "whole"), open_dataset(tmp_path / "merged")
    batch_a = a.collate([a[i] for i in range(len(a))])
    batch_b = b.collate([b[i] for i in range(len(b))])
    for k in batch_a:
        assert np.array_equal(batch_a[k].numpy(), batch_b[k].numpy()), k
    from astrai.config.train import TrainConfig
    from astrai.train import train

    tiny = {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "head_dim": 16,
            "ffn_dim": 64}
    losses = [train(TrainConfig(
        strategy="seq", model="tiny", model_overrides=tiny, data=str(tmp_path / d),
        out=str(tmp_path / f"run-{d}"), batch_size=4, max_steps=3, max_lr=1e-2,
        warmup_steps=1, ckpt_interval=0, peak_tflops=1.0, device="cpu", seed=0)).final_loss
        for d in ("whole", "merged")]
    assert losses[0] is not None and losses[0] == losses[1]


def test_parquet_is_streamed_by_record_batch(spec_for, tmp_path, monkeypatch):
    """The first chunk reaches the encoder before most record batches are decoded."""
    p = _parquet(tmp_path / "c.parquet", _paragraphs(60) * 10, row_group_size=30)
    monkeypatch.setattr(sources, "BATCH_ROWS", 10)
    monkeypatch.setattr("astrai.data.workers.CHUNK_LINES", 10)
    decoded = []
    real = pq.ParquetFile.iter_batches

    def counting(self, *a, **k):
        for b in real(self, *a, **k):
            decoded.append(b.num_rows)
            yield b

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counting)
    seen = []
    build_dataset(spec_for("pretrain", [p], packing={"mode": "none"}),
                  progress=lambda ev: seen.append(len(decoded)))
    assert len(decoded) == 60 and len(seen) == 60
    assert seen[0] <= 5  # a few batches ahead at most (the encoding look-ahead)
    assert seen[-1] == 60


def test_bad_inputs_are_one_line_errors(spec_for, tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not really parquet")
    with pytest.raises(DataError, match="bad.parquet: not a readable Parquet file"):
        build_dataset(spec_for("pretrain", [bad]))
    p = _parquet(tmp_path / "c.parquet", [{"body": "x" * 80}])
    with pytest.raises(DataError, match=r"c.parquet: no column 'text' \(columns: body\)"):
        build_dataset(spec_for("pretrain", [p]))
    z = tmp_path / "t.jsonl.zst"
    z.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "abc"}\n' * 100)[:-9])
    with pytest.raises(DataError, match="t.jsonl.zst: cannot be read"):
        build_dataset(spec_for("pretrain", [z]))
    for text in ("1", "3/3", "a/2", "-1/2", "1/0"):
        with pytest.raises(ConfigError, match="expected I/N"):
            parse_shard(text)
    one = _jsonl(tmp_path / "one.jsonl", _paragraphs(3))
    with pytest.raises(DataError, match="only 1 pieces"):
        build_dataset(spec_for("pretrain", [one]), shard=(1, 2))
    assert not (tmp_path / "out").exists()


def test_merge_refuses_mismatched_datasets(spec_for, tmp_path, tok):
    from astrai.data.testing import tiny_tokenizer

    f = _jsonl(tmp_path / "a.jsonl", _paragraphs(10))
    build_dataset(spec_for("pretrain", [f], output=str(tmp_path / "a")))
    build_dataset(spec_for("pretrain", [f], output=str(tmp_path / "packed"),
                           packing={"mode": "bfd"}))
    other = tiny_tokenizer(tmp_path / "tok2", 300)
    build_dataset(spec_for("pretrain", [f], output=str(tmp_path / "t2"),
                           tokenizer=str(other.path)))
    with pytest.raises(DataError, match="another tokenizer"):
        merge_datasets([tmp_path / "a", tmp_path / "t2"], tmp_path / "m")
    with pytest.raises(DataError, match="packing is"):
        merge_datasets([tmp_path / "a", tmp_path / "packed"], tmp_path / "m")
    three = [_jsonl(tmp_path / f"p{i}.jsonl", _paragraphs(10)) for i in range(3)]
    for i in (0, 2):
        build_dataset(spec_for("pretrain", three, output=str(tmp_path / f"s{i}")),
                      shard=(i, 3))
    with pytest.raises(DataError, match="shard 1 of 3 missing"):
        merge_datasets([tmp_path / "s0", tmp_path / "s2"], tmp_path / "m")
    with pytest.raises(DataError, match="pass each shard once"):
        merge_datasets([tmp_path / "s0", tmp_path / "s0"], tmp_path / "m")
    with pytest.raises(DataError, match="not a dataset directory"):
        merge_datasets([tmp_path / "a", tmp_path], tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_zstd_of_many_frames_reads_every_line(tmp_path):
    data = b"".join(b'{"text": "line %d"}\n' % i for i in range(3000))
    c = zstandard.ZstdCompressor()
    f = tmp_path / "m.jsonl.zst"
    f.write_bytes(c.compress(data[:20001]) + c.compress(data[20001:]))  # cut mid-line
    lines = [line for _, line, _ in sources.iter_jsonl(sources.Unit(f, None, 0))]
    assert b"".join(lines) == data
