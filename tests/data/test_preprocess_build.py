"""The builder: bad input (each a clear error, nothing left behind), filters, truncation,
packing efficiency, parallel workers, atomic output."""

import gzip
import json

import pytest
import torch

from astrai.config.preprocess import load_spec
from astrai.data.builder import build_dataset
from astrai.data.dataset import open_dataset
from astrai.errors import ConfigError, DataError

LONG = "The quality of mercy is not strained; it droppeth as the gentle rain. " * 2
CHAT = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}


def leftovers(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".out", "out")))


def fails(spec, match, tmp_path, exc=DataError, **kw):
    with pytest.raises(exc, match=match):
        build_dataset(spec, **kw)
    assert leftovers(tmp_path) == []  # nothing new in the output directory's parent


def test_malformed_json_fail_lists_first_five_file_lines(spec_for, tmp_path, write_jsonl):
    bad = ["{bad json"] * 7
    f = write_jsonl(tmp_path / "in.jsonl", [{"text": LONG}, *bad, {"text": LONG}])
    with pytest.raises(DataError) as e:
        build_dataset(spec_for("pretrain", [f]))
    msg = str(e.value)
    assert "in.jsonl:2: invalid JSON" in msg and "in.jsonl:6: invalid JSON" in msg
    assert "in.jsonl:7:" not in msg and "--on-error skip" in msg
    assert leftovers(tmp_path) == []


def test_malformed_json_skip_counts_and_keeps_the_rest(spec_for, tmp_path, write_jsonl):
    f = write_jsonl(tmp_path / "in.jsonl", [{"text": LONG}, "{bad", "[1, 2]", {"text": LONG}])
    res = build_dataset(spec_for("pretrain", [f]), on_error="skip")
    st = res.splits["train"]
    assert (st.records_read, st.records_kept, st.malformed) == (4, 2, 2)
    assert any("in.jsonl:3: expected a JSON object" in e for e in res.errors)


@pytest.mark.parametrize("record,match", [
    ({"body": LONG}, r"in.jsonl:1: missing field 'text' \(keys: body\)"),
    ({"text": 42}, "in.jsonl:1: field 'text' must be a string, got int"),
])
def test_missing_field_and_wrong_type(spec_for, tmp_path, write_jsonl, record, match):
    f = write_jsonl(tmp_path / "in.jsonl", [record])
    fails(spec_for("pretrain", [f]), match, tmp_path)


@pytest.mark.parametrize("record,match", [
    ({"messages": "hi"}, "field 'messages': expected a list of messages, got str"),
    ({"messages": [{"role": "user"}]}, r"messages'\[0\]: missing or non-string 'content'"),
    ({"messages": [{"role": "user", "content": "x"}]}, "no token is trained"),
])
def test_bad_chat_records(spec_for, tmp_path, write_jsonl, record, match):
    f = write_jsonl(tmp_path / "c.jsonl", [record])
    fails(spec_for("sft", [f]), match, tmp_path)


def test_empty_input(spec_for, tmp_path):
    f = tmp_path / "empty.jsonl"
    f.write_text("\n\n")
    fails(spec_for("pretrain", [f]), "no records in .*empty.jsonl; the input is empty", tmp_path)
    fails(spec_for("pretrain", [tmp_path / "nope*.jsonl"]), "matches no file", tmp_path)


def test_unknown_spec_key_and_bad_values():
    base = {"kind": "sft", "inputs": ["x"], "tokenizer": "t", "output": "o"}
    with pytest.raises(ConfigError, match="packng: unknown key"):
        load_spec(data={**base, "packng": {"mode": "bfd"}})
    with pytest.raises(ConfigError, match="packing.bufer: unknown key"):
        load_spec(data={**base, "packing": {"bufer": 3}})
    with pytest.raises(ConfigError, match="needs template: true"):
        load_spec(data={**base, "sections": [{"field": "m", "action": "$role"}]})
    with pytest.raises(ConfigError, match="never packed"):
        load_spec(data={**base, "kind": "dpo", "packing": {"mode": "bfd"}})
    with pytest.raises(ConfigError, match="max_seq_len: Input should be greater"):
        load_spec(data={**base, "max_seq_len": 0})


def test_role_with_no_mask_rule(spec_for, tmp_path, write_jsonl):
    rec = {"messages": [{"role": "tool_result", "content": "x"},
                        {"role": "assistant", "content": "y"}]}
    f = write_jsonl(tmp_path / "c.jsonl", [rec])
    fails(spec_for("sft", [f]), "c.jsonl:1: role 'tool_result' has no mask rule; add "
                                "roles.tool_result", tmp_path)


def test_tokenizer_path_that_does_not_exist(spec_for, tmp_path, write_jsonl):
    f = write_jsonl(tmp_path / "in.jsonl", [{"text": LONG}])
    spec = spec_for("pretrain", [f], tokenizer=str(tmp_path / "no-tok"))
    fails(spec, "tokenizer: .*no-tok does not exist", tmp_path, exc=ConfigError)


def test_text_that_tokenizes_to_nothing(spec_for, tmp_path, write_jsonl):
    f = write_jsonl(tmp_path / "in.jsonl", [{"text": ""}])
    spec = spec_for("pretrain", [f], filters={"min_chars": 0})
    fails(spec, "in.jsonl:1: 'text' tokenizes to nothing", tmp_path)


def test_failure_leaves_an_existing_output_untouched(spec_for, tmp_path, write_jsonl):
    good = write_jsonl(tmp_path / "good.jsonl", [{"text": LONG}])
    build_dataset(spec_for("pretrain", [good]))
    before = sorted(p.name for p in (tmp_path / "out").rglob("*"))
    bad = write_jsonl(tmp_path / "bad.jsonl", ["{nope"])
    with pytest.raises(DataError):
        build_dataset(spec_for("pretrain", [bad], overwrite=True))
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == before
    assert leftovers(tmp_path) == ["out"]
    with pytest.raises(ConfigError, match="already exists"):
        build_dataset(spec_for("pretrain", [good]))


def test_interrupted_run_leaves_no_dataset(spec_for, tmp_path, examples):
    def interrupt(ev):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_dataset(spec_for("pretrain", [examples / "shakespeare_val.jsonl"]),
                      progress=interrupt)
    assert leftovers(tmp_path) == []


def test_filters_apply_to_pretrain_text_only(spec_for, tmp_path, write_jsonl):
    f = write_jsonl(tmp_path / "in.jsonl", [{"text": "too short"}, {"text": LONG},
                                            {"text": "x" * 500}])
    st = build_dataset(spec_for("pretrain", [f], filters={"max_chars": 400})).splits["train"]
    assert (st.records_kept, st.filtered_short, st.filtered_long) == (1, 1, 1)
    c = write_jsonl(tmp_path / "c.jsonl", [CHAT])  # a 4-character chat survives
    st = build_dataset(spec_for("sft", [c], output=str(tmp_path / "o2"))).splits["train"]
    assert st.records_kept == 1
    only_short = write_jsonl(tmp_path / "s.jsonl", [{"text": "short"}])
    fails(spec_for("pretrain", [only_short], output=str(tmp_path / "o3")),
          "no record kept of 1 read .1 shorter than filters.min_chars", tmp_path / "o2")


def test_truncation_sides_count_dropped_tokens(spec_for, tmp_path, write_jsonl, tok):
    f = write_jsonl(tmp_path / "in.jsonl", [{"text": LONG}])
    n = len(tok.encode(LONG)) + 2  # BOS + EOS
    for side in ("right", "left"):
        out = tmp_path / side
        res = build_dataset(spec_for("pretrain", [f], max_seq_len=16, truncation=side,
                                     packing={"mode": "bfd"}, output=str(out)))
        assert res.splits["train"].dropped_tokens == n - 16
        ids = open_dataset(out)[0]["input_ids"].tolist()
        full = [tok.bos_id] + tok.encode(LONG) + [tok.eos_id]
        assert ids == (full[:16] if side == "right" else full[-16:])
    res = build_dataset(spec_for("pretrain", [f], max_seq_len=16, output=str(tmp_path / "s")))
    assert res.splits["train"].dropped_tokens == 0  # bfd_split splits instead
    assert res.splits["train"].tokens == n


def test_bfd_split_efficiency_on_the_sample_corpus(spec_for, examples):
    res = build_dataset(spec_for("pretrain", [examples / "shakespeare_train.jsonl"],
                                 max_seq_len=2048, packing={"mode": "bfd_split"}))
    st = res.splits["train"]
    assert st.dropped_tokens == 0
    assert st.packing_efficiency >= 0.92


def test_workers_give_identical_output(spec_for, tmp_path, examples):
    src = [examples / "sft_val.jsonl", examples / "sft_train.jsonl"]
    a = build_dataset(spec_for("sft", src, output=str(tmp_path / "a"), max_records=600))
    build_dataset(spec_for("sft", src, output=str(tmp_path / "b"), max_records=600),
                      workers=2)
    assert a.splits["train"].records_read == 600
    da, db = open_dataset(tmp_path / "a"), open_dataset(tmp_path / "b")
    assert len(da) == len(db) == 600
    for i in range(0, 600, 37):
        assert da[i]["input_ids"].tolist() == db[i]["input_ids"].tolist()
        assert da[i]["loss_mask"].tolist() == db[i]["loss_mask"].tolist()


def test_gzip_and_glob_inputs(spec_for, tmp_path):
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": LONG}) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": LONG + " more"}) + "\n")
    res = build_dataset(spec_for("pretrain", [str(tmp_path / "*.jsonl*")],
                                 packing={"mode": "none"}))
    assert res.splits["train"].records_kept == 2


def test_all_train_without_template_omits_loss_mask(spec_for, tmp_path, write_jsonl):
    f = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "Q", "answer": "A"}])
    spec = spec_for("sft", [f], sections=[{"field": "prompt"}, {"field": "answer"}])
    build_dataset(spec)
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert "loss_mask" not in m["keys"] and m["has_loss_mask"] is False
    s = open_dataset(tmp_path / "out")[0]
    assert s["loss_mask"].tolist() == [1] * (len(s["input_ids"]) - 1) + [0]


def test_grpo_group_sizes_must_agree(spec_for, tmp_path, write_jsonl):
    recs = [{"prompt": "a?", "responses": ["1", "2"], "rewards": [1, 0]},
            {"prompt": "b?", "responses": ["1", "2", "3"], "rewards": [1, 0, 0]}]
    f = write_jsonl(tmp_path / "g.jsonl", recs)
    fails(spec_for("grpo", [f]), "g.jsonl:2: has 3 responses but earlier records have 2",
          tmp_path)
    mixed = write_jsonl(tmp_path / "m.jsonl", [recs[0], {"prompt": "c?", "reference": "4"}])
    fails(spec_for("grpo", [mixed]), "m.jsonl:2: mixes online records", tmp_path)
    wrong = write_jsonl(tmp_path / "w.jsonl", [{"prompt": "a", "responses": ["x"],
                                                 "rewards": [1, 2]}])
    fails(spec_for("grpo", [wrong]), "'rewards' must be a list of 1 numbers", tmp_path)


def test_max_records_and_overrides(tmp_path, tok, examples):
    spec = load_spec(data={"kind": "sft", "inputs": [str(examples / "sft_val.jsonl")],
                           "tokenizer": str(tok.path), "output": str(tmp_path / "o")},
                     overrides=["max_records=10", "packing.mode=bfd", "roles.system=train",
                                "max_seq_len=64"])
    assert spec.max_records == 10 and spec.packing.mode == "bfd"
    assert spec.roles["system"] == "train" and spec.max_seq_len == 64
    st = build_dataset(spec).splits["train"]
    assert st.records_read == 10 and st.samples < 10  # packed several chats per row
    with pytest.raises(ConfigError, match="expected key=value"):
        load_spec(data={"kind": "sft", "inputs": ["x"], "tokenizer": "t", "output": "o"},
                  overrides=["max_records"])


@pytest.mark.parametrize("side", ["left", "right"])
def test_dpo_truncation_keeps_one_prompt(spec_for, tmp_path, write_jsonl, tok, side):
    rec = {"prompt": "Tell me a long story about the sea " * 3, "chosen": "Waves.",
           "rejected": "No, I will not tell you any story about the sea at all."}
    f = write_jsonl(tmp_path / "p.jsonl", [rec])
    build_dataset(spec_for("dpo", [f], max_seq_len=40, truncation=side))
    s = open_dataset(tmp_path / "out")[0]
    assert len(s["chosen"]) <= 40 and len(s["rejected"]) <= 40
    p = int(s["chosen_mask"].argmax())
    assert p == int(s["rejected_mask"].argmax())
    assert torch.equal(s["chosen"][:p], s["rejected"][:p])  # the same prompt tokens
    if side == "left":  # the responses survive whole
        assert tok.decode(s["chosen"][p:].tolist()).startswith("Waves.")


def test_uint32_tokens_when_the_vocabulary_does_not_fit(spec_for, tmp_path, write_jsonl,
                                                         monkeypatch):
    from astrai.data import builder

    assert builder.token_dtype_for(65536) == "uint16"
    assert builder.token_dtype_for(65537) == "uint32"
    monkeypatch.setattr(builder, "UINT16_VOCAB", 100)  # our 512-id tokenizer "does not fit"
    f = write_jsonl(tmp_path / "in.jsonl", [{"text": LONG}])
    for fmt in ("h5", "bin"):
        build_dataset(spec_for("pretrain", [f], format=fmt, output=str(tmp_path / fmt)))
        m = json.loads((tmp_path / fmt / "manifest.json").read_text())
        assert m["token_dtype"] == "uint32" and m["keys"]["input_ids"] == "uint32"
    assert open_dataset(tmp_path / "h5")[0]["input_ids"].tolist() == (
        open_dataset(tmp_path / "bin")[0]["input_ids"].tolist())


def test_invalid_utf8_names_the_line(spec_for, tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_bytes(json.dumps({"text": LONG}).encode() + b"\n" + b'{"text": "\xff\xfe"}\n')
    fails(spec_for("pretrain", [f]), r"in.jsonl:2: not valid UTF-8", tmp_path)
