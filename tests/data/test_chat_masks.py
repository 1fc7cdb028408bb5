"""Template-mode masking (`astrai.data.chat_ids`: one render, one encode, masks from character
spans) and the promise that SFT trains on exactly the tokens chat feeds the model for the
same history. Real families against transformers: test_chat_ids_hf.py."""

import json

import numpy as np
import pytest

from astrai.config.preprocess import load_spec
from astrai.data.encode import RecordEncoder
from astrai.data.tokenizer import Tokenizer

QWEN2_STYLE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Llama-2 style: a BOS before every user turn, assistant turns closed by EOS.
BOS_PER_TURN = (
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ bos_token + '[INST] ' + m['content']"
    " + ' [/INST]' }}{% else %}{{ ' ' + m['content'] + eos_token }}{% endif %}{% endfor %}"
)
TWO_TURNS = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]


def with_template(tok: Tokenizer, template: str) -> Tokenizer:
    return Tokenizer(tok.backend, bos_token=tok.bos_token, eos_token=tok.eos_token,
                     pad_token=tok.pad_token, chat_template=template)


def encode_sft(tok: Tokenizer, messages, **spec) -> tuple[list[int], list[int]]:
    s = load_spec(data={"kind": "sft", "inputs": ["x"], "tokenizer": "t", "output": "o", **spec})
    (res,) = RecordEncoder(s, tok).encode_lines([("chat.jsonl", 1,
                                                  json.dumps({"messages": messages}))])
    assert res[0] == "ok", res
    return res[2]["input_ids"].tolist(), res[2]["loss_mask"].tolist()


def test_golden_two_turn_chat(tok):
    ids, mask = encode_sft(tok, TWO_TURNS)
    # the expected rendering and which parts are trained, written out by hand
    parts = [("<|bos|>", 0), ("<|im_start|>user\nHi there<|im_end|>\n", 0),
             ("<|im_start|>assistant\n", 0), ("Hello!<|im_end|>", 1), ("\n", 0),
             ("<|im_start|>user\n2+2?<|im_end|>\n", 0), ("<|im_start|>assistant\n", 0),
             ("4<|im_end|>", 1), ("\n", 0)]
    want_ids, want_mask = [], []
    for text, m in parts:
        part = tok.encode(text)
        want_ids += part
        want_mask += [m] * len(part)
    assert ids == want_ids
    assert mask == want_mask
    assert tok.decode(ids, skip_special_tokens=False) == "".join(p for p, _ in parts)
    trained = [i for i, m in zip(ids, mask) if m]
    assert tok.decode(trained, skip_special_tokens=False) == "Hello!<|im_end|>4<|im_end|>"


@pytest.mark.parametrize("template", [None, QWEN2_STYLE, BOS_PER_TURN],
                         ids=["default", "qwen2-style", "bos-per-turn"])
def test_sft_tokens_equal_what_chat_feeds_the_model(tok, template):
    t = with_template(tok, template) if template else tok
    convo = [{"role": "user", "content": "Name a colour."},
             {"role": "assistant", "content": "Blue."},
             {"role": "user", "content": "Another?"},
             {"role": "assistant", "content": "Crimson — 深红 🙂"}]
    ids, mask = encode_sft(t, convo)
    for k in (1, 3):  # before each assistant turn
        prompt = t.encode_chat(convo[:k], add_generation_prompt=True)
        assert ids[: len(prompt)] == prompt, f"history of {k} messages"
        # of the prompt, only earlier assistant replies are trained
        earlier = [i for i, m in zip(ids[: len(prompt)], mask) if m]
        assert t.decode(earlier).replace(" ", "") == "".join(
            m["content"].replace(" ", "") for m in convo[:k] if m["role"] == "assistant")
        # what follows is the assistant's reply (after the template's separator, if any),
        # trained up to its stop token
        a = next(j for j in range(len(prompt), len(ids)) if mask[j])
        assert t.decode(ids[len(prompt):a]).strip() == ""
        n = next((j for j in range(a, len(ids)) if not mask[j]), len(ids))
        reply = ids[a:n]
        assert reply[-1] in t.stop_ids
        assert t.decode(reply).strip() == convo[k]["content"]
    # and the whole conversation renders as the template says
    full = t.render_chat(convo)
    assert t.decode(ids, skip_special_tokens=False) == full
    assert ids == t.encode(full)  # one encode of one render


def test_qwen2_style_matches_hf_apply_chat_template(tok):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tok.path))
    convo = TWO_TURNS[:3]
    theirs = hf.apply_chat_template(convo, chat_template=QWEN2_STYLE, tokenize=True,
                                    add_generation_prompt=True)
    theirs = list(theirs["input_ids"] if hasattr(theirs, "keys") else theirs)
    ours = with_template(tok, QWEN2_STYLE).encode_chat(convo)
    assert ours == theirs  # no BOS: the template writes none


def test_roles_rules_and_non_template_sections(tok):
    ids, mask = encode_sft(tok, TWO_TURNS, roles={"user": "train", "assistant": "mask"})
    user_text = tok.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=False)
    assert "Hi there" in user_text and "Hello!" not in user_text
    s = load_spec(data={"kind": "sft", "inputs": ["x"], "tokenizer": "t", "output": "o",
                        "sections": [{"field": "q", "action": "mask"},
                                     {"field": "a", "action": "train"}]})
    (res,) = RecordEncoder(s, tok).encode_lines([("f", 1, '{"q": "Question?", "a": " Yes"}')])
    got, m = res[2]["input_ids"].tolist(), res[2]["loss_mask"].tolist()
    q, a = tok.encode("Question?"), tok.encode(" Yes")
    assert got == [tok.bos_id] + q + a + [tok.eos_id]
    assert m == [0] * (1 + len(q)) + [1] * (len(a) + 1)


def test_role_without_rule_is_an_error(tok):
    s = load_spec(data={"kind": "sft", "inputs": ["x"], "tokenizer": "t", "output": "o"})
    convo = '{"messages": [{"role": "narrator", "content": "x"}, ' \
            '{"role": "assistant", "content": "y"}]}'
    (res,) = RecordEncoder(s, tok).encode_lines([("c.jsonl", 7, convo)])
    assert res[0] == "error"
    assert "c.jsonl:7: role 'narrator' has no mask rule" in res[2]


def test_template_that_rewrites_history_trains_the_final_render(tok):
    # drops everything before </think> in earlier replies (as Qwen3 does): not prefix-stable
    t = with_template(tok, "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if not "
                           "loop.last %}{{ m['content'].split('</think>')[-1] }}{% else %}"
                           "{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}")
    convo = [{"role": "user", "content": "a"},
             {"role": "assistant", "content": "<think>x</think>first"},
             {"role": "user", "content": "b"},
             {"role": "assistant", "content": "<think>y</think>second"}]
    ids, mask = encode_sft(t, convo)
    trained = t.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=False)
    assert trained == "first<|im_end|><think>y</think>second<|im_end|>"


def test_reply_missing_from_the_render_is_an_error_naming_the_record(tok):
    t = with_template(tok, "{% for m in messages %}{{ m['content'] | upper }}\n{% endfor %}")
    s = load_spec(data={"kind": "sft", "inputs": ["x"], "tokenizer": "t", "output": "o"})
    (res,) = RecordEncoder(s, t).encode_lines([("c.jsonl", 3, json.dumps(
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    ))])
    assert res[0] == "error"
    assert res[2].startswith("c.jsonl:3: message 1 (assistant) cannot be located")


def test_mask_arrays_are_compact(tok):
    ids, mask = encode_sft(tok, TWO_TURNS)
    assert set(mask) == {0, 1} and len(ids) == len(mask)
    assert np.asarray(ids).max() < tok.vocab_size


def test_mask_from_encoding_equals_the_per_token_loop(tok):
    from astrai.data.chat_ids import mask_from_encoding, mask_from_offsets, render_conversation

    replies = ["Crimson — 深红 🙂", "", "🙂🙃", " x ", "\n\nnl\n", "ok"]
    for k in range(len(replies)):
        convo = []
        for r in replies[k:] + replies[:k]:
            convo += [{"role": "user", "content": "q 🙂"}, {"role": "assistant", "content": r}]
        rc = render_conversation(tok, convo)
        (enc,) = tok.encode_encodings([rc.text])
        stop = set(tok.stop_ids)
        assert mask_from_encoding(enc, rc.spans, stop) == mask_from_offsets(
            enc.ids, enc.offsets, rc.spans, stop)


def test_generation_blocks_render_their_body(tok):
    # transformers' assistant-mask marker: accepted, rendered unchanged
    t = with_template(tok, "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role']"
                           " == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>"
                           "{% endgeneration %}{% else %}{{ m['content'] }}<|im_end|>{% endif %}"
                           "\n{% endfor %}")
    ids, mask = encode_sft(t, TWO_TURNS)
    trained = t.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=False)
    assert trained == "Hello!<|im_end|>4<|im_end|>"
