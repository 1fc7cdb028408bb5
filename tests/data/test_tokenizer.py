"""Tokenizer: training, files HF reads and writes, special ids, streaming decode."""

import json

import pytest

from astrai.data.bpe import SpecialTokens, train_tokenizer
from astrai.data.testing import tiny_corpus_path
from astrai.data.tokenizer import Tokenizer
from astrai.errors import ConfigError, DataError

TEXTS = ["Hello world", "你好，世界！今天天气很好。", "Emoji 🙂🚀👍🏽 and naïve café",
         "  leading spaces\n\ttabs\r\n", "Привет, мир", ""]


def test_trained_tokenizer_roundtrips_and_has_special_ids(tok):
    assert tok.vocab_size == 512
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (0, 1, 2)
    assert tok.stop_ids == [1, tok.token_to_id("<|im_end|>")]
    for t in TEXTS:
        assert tok.decode(tok.encode(t)) == t
    assert tok.encode("abc", add_special_tokens=True) == [tok.bos_id] + tok.encode("abc")
    assert tok.encode_batch(TEXTS) == [tok.encode(t) for t in TEXTS]
    # special tokens in text are single ids, and skipped on decode when asked
    ids = tok.encode("<|im_start|>user")
    assert ids[0] == tok.token_to_id("<|im_start|>")
    assert tok.decode(ids) == "user"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>user"


def test_save_load_keeps_ids_template_and_fingerprint(tok, tmp_path):
    tok.save(tmp_path / "copy")
    names = sorted(p.name for p in (tmp_path / "copy").iterdir())
    assert names == ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]
    again = Tokenizer.load(tmp_path / "copy")
    assert again.fingerprint() == tok.fingerprint()
    assert again.chat_template == tok.chat_template
    assert [again.encode(t) for t in TEXTS] == [tok.encode(t) for t in TEXTS]
    assert (again.bos_id, again.eos_id, again.pad_id, again.stop_ids) == (
        tok.bos_id, tok.eos_id, tok.pad_id, tok.stop_ids)


def test_fingerprint_changes_with_the_vocabulary(tok, tmp_path):
    other = train_tokenizer([tiny_corpus_path()], 600, tmp_path / "t600")
    assert other.fingerprint() != tok.fingerprint()
    assert len(tok.fingerprint()) == 16


def test_hf_transformers_reads_our_directory(tok):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tok.path))
    for t in TEXTS:
        assert hf.encode(t, add_special_tokens=False) == tok.encode(t)
    assert hf.bos_token_id == tok.bos_id and hf.eos_token_id == tok.eos_id
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]
    theirs = hf.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    theirs = theirs["input_ids"] if isinstance(theirs, dict) or hasattr(theirs, "keys") else theirs
    assert list(theirs) == tok.encode_chat(msgs)
    assert hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == (
        tok.render_chat(msgs, add_generation_prompt=True))


def test_loads_hf_directory_with_template_in_tokenizer_config(tok, tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    (d / "tokenizer.json").write_text(tok.backend.to_str())
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    (d / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": None, "eos_token": {"content": "<|endoftext|>"}, "pad_token": None,
        "chat_template": template}))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 3]}))
    t = Tokenizer.load(d)
    assert t.chat_template == template
    assert t.bos_id is None and t.pad_id == t.eos_id == 1
    assert t.stop_ids == [1, 4, 3]  # eos, <|im_end|>, then generation_config's extra id
    assert t.render_chat([{"role": "user", "content": "x"}]) == "[user] x\n"
    # with no BOS token, encode_chat prepends nothing
    assert t.encode_chat([{"role": "user", "content": "x"}], False) == t.encode("[user] x\n")


def test_named_template_list_in_tokenizer_config(tok, tmp_path):
    d = tmp_path / "hf2"
    d.mkdir()
    (d / "tokenizer.json").write_text(tok.backend.to_str())
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}))
    assert Tokenizer.load(d).chat_template == "D"


def test_stream_decoder_never_splits_a_character(tok):
    text = "Grüße 你好，世界！🙂🚀👍🏽 naïve <|im_end|> done"
    ids = tok.encode(text)
    assert len(ids) > len(text) / 3  # multi-byte characters span several byte tokens
    d = tok.stream_decoder()
    pieces = [d.push(i) for i in ids]
    pieces.append(d.flush())
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == tok.decode(ids)
    # a character split over tokens is held back, then emitted whole
    emoji = tok.encode("🙂")
    assert len(emoji) > 1
    d = tok.stream_decoder()
    assert [d.push(i) for i in emoji[:-1]] == [""] * (len(emoji) - 1)
    assert d.push(emoji[-1]) == "🙂"


def test_stream_decoder_keeps_special_tokens_when_asked(tok):
    ids = tok.encode("a<|im_end|>b")
    d = tok.stream_decoder(skip_special_tokens=False)
    assert "".join(d.push(i) for i in ids) + d.flush() == "a<|im_end|>b"


def test_stream_decoder_on_long_generation_stays_exact(tok):
    text = tiny_corpus_path().read_text(encoding="utf-8")[-3000:]
    ids = tok.encode(text)
    d = tok.stream_decoder()
    assert "".join(d.push(i) for i in ids) + d.flush() == tok.decode(ids)


def test_train_errors_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="vocab_size 100 is below 261"):
        train_tokenizer([tiny_corpus_path()], 100, tmp_path / "t")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: missing field 'text'"):
        train_tokenizer([bad], 300, tmp_path / "t")
    with pytest.raises(DataError, match="matches no file"):
        train_tokenizer([str(tmp_path / "nothing*.jsonl")], 300, tmp_path / "t")
    assert not (tmp_path / "t").exists()


def test_custom_special_tokens_and_jsonl_field(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(json.dumps({"body": f"line {i} of text"}) for i in range(50)))
    t = train_tokenizer([f], 300, tmp_path / "t", field="body",
                        special_tokens=SpecialTokens(bos="<s>", eos="</s>", pad="<pad>",
                                                     extra=["<tool>"]))
    assert (t.bos_id, t.eos_id, t.pad_id, t.token_to_id("<tool>")) == (0, 1, 2, 3)
    assert t.stop_ids == [1]


def test_load_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        Tokenizer.load(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no tokenizer.json"):
        Tokenizer.load(tmp_path / "empty")
