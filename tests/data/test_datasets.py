"""Datasets per kind, collate, manifest, the dataset's tokenizer copy, the spec schema."""

import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from astrai.config.preprocess import spec_schema
from astrai.data import RDSampler, dataset_tokenizer_dir, make_collate, open_dataset
from astrai.data.builder import build_dataset
from astrai.data.packing import IGNORE
from astrai.data.testing import tiny_dataset
from astrai.data.tokenizer import Tokenizer
from astrai.errors import DataError


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds")
    return {k: tiny_dataset(tmp, k.split("-")[0], offline=k.endswith("offline"))
            for k in ("pretrain", "sft", "dpo", "grpo", "grpo-offline")}


def test_pretrain_samples(dirs):
    ds = open_dataset(dirs["pretrain"])
    m = ds.manifest
    assert m["kind"] == "pretrain" and m["position_ids"] == "doc_reset"
    assert set(m["keys"]) == {"input_ids", "doc_lens"}
    tok = Tokenizer.load(dataset_tokenizer_dir(dirs["pretrain"]))
    assert tok.fingerprint() == m["tokenizer"]["fingerprint"] == ds.fingerprint
    for i in range(len(ds)):
        s = ds[i]
        ids, tgt, doc, pos = s["input_ids"], s["target_ids"], s["doc_ids"], s["position_ids"]
        assert all(t.dtype == torch.int64 and t.dim() == 1 for t in s.values())
        assert len(ids) <= ds.seq_len == 128
        same_doc = doc[1:] == doc[:-1]
        assert torch.equal(tgt[:-1][same_doc], ids[1:][same_doc])  # shifted by one
        assert (tgt[:-1][~same_doc] == IGNORE).all() and tgt[-1] == IGNORE
        starts = torch.cat([torch.tensor([True]), ~same_doc])
        assert (pos[starts] == 0).all()  # doc_reset
    assert len(open_dataset(dirs["pretrain"], "val")) > 0
    with pytest.raises(DataError, match="no 'test' split"):
        open_dataset(dirs["pretrain"], "test")


def test_sft_samples_and_collate(dirs):
    ds = open_dataset(dirs["sft"])
    batch = [ds[i] for i in range(4)]
    b = ds.collate(batch)
    T = max(len(s["input_ids"]) for s in batch)
    assert b["input_ids"].shape == (4, T)
    for k, s in enumerate(batch):
        n = len(s["input_ids"])
        assert torch.equal(b["input_ids"][k, :n], s["input_ids"])
        assert (b["input_ids"][k, n:] == ds.pad_id).all()
        assert (b["target_ids"][k, n:] == IGNORE).all() and (b["loss_mask"][k, n:] == 0).all()
        assert (b["doc_ids"][k, n:] == -1).all() and (b["position_ids"][k, n:] == 0).all()
        assert torch.equal(s["loss_mask"].bool(), s["target_ids"] != IGNORE)
    tok = Tokenizer.load(ds.tokenizer_dir)
    trained = batch[0]["target_ids"][batch[0]["loss_mask"].bool()]
    assert tok.decode(trained.tolist(), skip_special_tokens=False).endswith("<|im_end|>")
    padded = make_collate("sft", ds.pad_id, pad_to_multiple=64)(batch)["input_ids"].shape[1]
    assert padded % 64 == 0 and T <= padded < T + 64


def test_dpo_samples(dirs):
    ds = open_dataset(dirs["dpo"])
    tok = Tokenizer.load(ds.tokenizer_dir)
    s = ds[0]
    c, r = s["chosen"], s["rejected"]
    p = int((s["chosen_mask"] == 0).long().argmin())  # first response token
    assert torch.equal(c[:p], r[:p])  # the same prompt
    assert tok.decode(c[:p].tolist(), skip_special_tokens=False).endswith(
        "<|im_start|>assistant\n")
    b = ds.collate([ds[0], ds[1]])
    assert b["chosen"].shape == b["rejected"].shape == b["chosen_mask"].shape


def test_grpo_online_and_offline(dirs):
    on = open_dataset(dirs["grpo"])
    tok = Tokenizer.load(on.tokenizer_dir)
    s = on[0]
    assert isinstance(s["reference"], str) and s["reference"]
    b = on.collate([on[0], on[1], on[2]])
    assert b["prompts"].shape == b["prompt_mask"].shape
    assert (b["prompt_mask"][:, -1] == 1).all()  # left padded: prompts end together
    assert tok.decode(b["prompts"][0].tolist(), skip_special_tokens=False).endswith(
        "<|im_start|>assistant\n")
    first = Path(on.manifest["spec"]["inputs"][0]).read_text().splitlines()[0]
    prompt = json.loads(first)["prompt"]
    assert s["prompts"].tolist() == tok.encode_chat([{"role": "user", "content": prompt}])
    off = open_dataset(dirs["grpo-offline"])
    s = off[0]
    G = s["rewards"].shape[0]
    assert G == 4 and s["responses"].shape[0] == G and s["masks"].shape == s["responses"].shape
    for g in range(G):
        n = int(s["masks"][g].sum())
        assert s["responses"][g, n - 1].item() in tok.stop_ids  # ends at the stop token
    b = off.collate([off[i] for i in range(3)])
    assert b["responses"].shape[:2] == (3, 4) and b["rewards"].shape == (3, 4)
    assert b["rewards"].dtype == torch.float32


def test_dataloader_with_sampler_and_workers(dirs):
    ds = open_dataset(dirs["sft"])
    dl = DataLoader(ds, batch_size=8, sampler=RDSampler(len(ds), seed=0),
                    collate_fn=ds.collate, num_workers=2)
    n = sum(b["input_ids"].shape[0] for b in dl)
    assert n == len(ds)


def test_position_ids_none_and_continuous(tmp_path):
    d = tiny_dataset(tmp_path, "pretrain", position_ids="none", n=8, n_val=2)
    assert "position_ids" not in open_dataset(d)[0]
    d = tiny_dataset(tmp_path, "pretrain", position_ids="continuous", n=8, n_val=2,
                     output=str(tmp_path / "cont"))
    s = open_dataset(d)[0]
    assert s["position_ids"].tolist() == list(range(len(s["input_ids"])))


def test_not_a_dataset(tmp_path):
    with pytest.raises(DataError, match="not a dataset directory"):
        open_dataset(tmp_path)


def test_schema_forbids_unknown_keys():
    schema = spec_schema()
    assert schema["additionalProperties"] is False
    assert {"kind", "inputs", "tokenizer", "output"} <= set(schema["required"])
    assert "description" in schema["properties"]["max_seq_len"]
    assert schema["$defs"]["Packing"]["additionalProperties"] is False


def test_example_specs_validate():
    from astrai.config.preprocess import load_spec

    specs = sorted((Path(__file__).parents[2] / "examples" / "specs").glob("*.json"))
    assert len(specs) >= 4
    kinds = {load_spec(p).kind for p in specs}
    assert kinds == {"pretrain", "sft", "dpo", "grpo"}


def test_build_result_reports(dirs, tmp_path):
    m = json.loads((dirs["pretrain"] / "manifest.json").read_text())
    st = m["splits"]["train"]
    assert st["tokens"] == sum(s["tokens"] for s in st["shards"])
    assert 0 < st["packing_efficiency"] <= 1
    assert build_dataset  # the builder is what made them
