"""Conversations -> ids equal transformers' `apply_chat_template`, per real model family.

For 32+ conversations per family (single and multi-turn, with and without a system prompt,
empty contents, unicode, replies with leading/trailing spaces and newlines, a Qwen3 `<think>`
reply): the chat prompt ids (generation prompt added), SFT input ids, DPO chosen/rejected
ids and GRPO prompt ids equal those transformers computes in a separate process; SFT and
DPO masks train exactly each assistant reply's content and the end-of-turn token after it.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap

import pytest

from astrai.config.preprocess import load_spec
from astrai.data.chat_ids import conversation_ids, mask_from_offsets, render_conversation
from astrai.data.encode import RecordEncoder
from astrai.data.tokenizer import Tokenizer

pytest.importorskip("transformers")

USER = ["Hello", "What is 2+2?", "  leading spaces", "trailing newline\n", "",
        "Ünïcödé — 深红 🙂 مرحبا", "multi\nline\n\ntext", "tabs\tand  double  spaces",
        "<b>html</b> & 'quotes'", "List two fruits.", "Thanks", " x "]
ASSISTANT = ["Hi!", "\n- apple\n- pear", " leading space", "trailing space ", "Bonjour", "4",
             "", "\n\nnewlines both\n\n", "emoji 🙂🙃 and 中文", "Line one.\nLine two.",
             "<think>let me think</think>\n\nAnswer: 42", "I", "  ", "ok\n"]
SYSTEM = ["Be brief.", "You are a pirate. Speak like one!", "Réponds en français.", ""]


def conversations() -> list[list[dict]]:
    """Full conversations (ending with an assistant reply), deterministic."""
    rng = random.Random(0)
    out = [[{"role": "user", "content": "List two fruits."},
            {"role": "assistant", "content": "\n- apple\n- pear"},
            {"role": "user", "content": "Thanks"}, {"role": "assistant", "content": "Bonjour"}]]
    for k in range(33):
        msgs = [{"role": "system", "content": rng.choice(SYSTEM)}] if k % 3 == 0 else []
        for _ in range(1 + k % 3):
            msgs += [{"role": "user", "content": rng.choice(USER)},
                     {"role": "assistant", "content": rng.choice(ASSISTANT)}]
        out.append(msgs)
    return out


HF = textwrap.dedent("""
    import json, sys
    from transformers import AutoTokenizer
    dirs, convs = json.loads(open(sys.argv[1]).read())
    def ids(tok, msgs, agp):
        out = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=agp,
                                      return_dict=False)
        return list(out["input_ids"] if hasattr(out, "keys") else out)
    res = {}
    for fam, d in dirs.items():
        tok = AutoTokenizer.from_pretrained(d)
        res[fam] = [{"full": ids(tok, c, False), "prompt": ids(tok, c[:-1], True),
                     "rejected": ids(tok, c[:-1] + [{"role": "assistant", "content": "No."}],
                                     False)} for c in convs]
    open(sys.argv[2], "w").write(json.dumps(res))
""")


@pytest.fixture(scope="module")
def reference(real_tokenizer_dirs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf-chat")
    convs = conversations()
    dirs = {k: str(v) for k, v in real_tokenizer_dirs.items()}
    (tmp / "in.json").write_text(json.dumps([dirs, convs]))
    subprocess.run([sys.executable, "-c", HF, str(tmp / "in.json"), str(tmp / "out.json")],
                   check=True, timeout=300)
    return convs, json.loads((tmp / "out.json").read_text())


def expected_replies(msgs: list[dict]) -> list[str]:
    return [m["content"] for m in msgs if m["role"] == "assistant"]


def check_mask(tok: Tokenizer, ids: list[int], mask: list[int], replies: list[str]) -> None:
    """Each trained run is one reply's content (as the template renders it) + end-of-turn."""
    runs, cur = [], []
    for i, m in zip(ids, mask, strict=True):
        if m:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    assert len(runs) == len(replies), (runs, replies)
    for run, reply in zip(runs, replies, strict=True):
        assert run[-1] in tok.stop_ids
        body = run[:-1]
        while body and body[-1] in tok.stop_ids:
            body = body[:-1]
        text = tok.decode(body, skip_special_tokens=False).strip()
        forms = {reply.strip(), reply.split("</think>")[-1].strip()}
        assert text in forms, (text, reply)


@pytest.mark.parametrize("family", ["qwen3", "qwen2.5", "llama3", "mistral"])
def test_chat_sft_dpo_grpo_ids_equal_transformers(family, real_tokenizer_dirs, reference):
    convs, ref = reference
    tok = Tokenizer.load(real_tokenizer_dirs[family])
    common = {"inputs": ["x"], "tokenizer": str(real_tokenizer_dirs[family]), "output": "o",
              "max_seq_len": 4096}
    sft = RecordEncoder(load_spec(data={"kind": "sft", **common}), tok)
    dpo = RecordEncoder(load_spec(data={"kind": "dpo", **common}), tok)
    grpo = RecordEncoder(load_spec(data={"kind": "grpo", **common}), tok)
    lines_sft, lines_dpo, lines_grpo = [], [], []
    for n, c in enumerate(convs):
        lines_sft.append(("c.jsonl", n + 1, json.dumps({"messages": c})))
        pair = {"prompt": c[:-1], "chosen": c[-1:], "rejected": "No."}
        lines_dpo.append(("p.jsonl", n + 1, json.dumps(pair)))
        lines_grpo.append(("g.jsonl", n + 1, json.dumps({"prompt": c[:-1], "reference": "4"})))
    got_sft = sft.encode_lines(lines_sft)
    got_dpo = dpo.encode_lines(lines_dpo)
    got_grpo = grpo.encode_lines(lines_grpo)
    assert len(convs) >= 30
    for c, want, s, d, g in zip(convs, ref[family], got_sft, got_dpo, got_grpo, strict=True):
        # chat: the prompt a model answers
        assert conversation_ids(tok, c[:-1], add_generation_prompt=True).ids == want["prompt"]
        # sft
        assert s[0] == "ok", s
        ids, mask = s[2]["input_ids"].tolist(), s[2]["loss_mask"].tolist()
        assert ids == want["full"], c
        check_mask(tok, ids, mask, expected_replies(c))
        (enc,) = tok.encode_encodings([tok.render_chat(c)])
        assert mask == mask_from_offsets(enc.ids, enc.offsets, render_conversation(
            tok, c).spans, set(tok.stop_ids))  # the char_to_token path = the per-token loop
        # dpo
        assert d[0] == "ok", d
        assert d[2]["chosen"].tolist() == want["full"]
        assert d[2]["rejected"].tolist() == want["rejected"]
        check_mask(tok, want["full"], d[2]["chosen_mask"].tolist(), [c[-1]["content"]])
        check_mask(tok, want["rejected"], d[2]["rejected_mask"].tolist(), ["No."])
        # grpo
        assert g[0] == "ok", g
        assert g[2]["prompts"].tolist() == want["prompt"]


def test_sft_on_a_tokenizer_without_template_is_refused_until_one_is_named(tmp_path):
    from astrai.data.builder import build_dataset
    from astrai.errors import NoTemplateError
    from tests.real_tokenizers import unpack

    tok_dir = unpack("mistral-7b", tmp_path / "mistral")  # a base model: no template
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "Salut"},
                                             {"role": "assistant", "content": "Bonjour"}]}))
    spec = {"kind": "sft", "inputs": [str(data)], "tokenizer": str(tok_dir),
            "output": str(tmp_path / "ds")}
    with pytest.raises(NoTemplateError, match=r"mistral has no chat template.*chat_template"):
        build_dataset(load_spec(data=spec))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.jsonl", "mistral"]
    build_dataset(load_spec(data={**spec, "chat_template": "mistral"}))
    tok = Tokenizer.load(tmp_path / "ds" / "tokenizer")  # the copy keeps the template
    ids = conversation_ids(tok, [{"role": "user", "content": "Salut"},
                                 {"role": "assistant", "content": "Bonjour"}])
    trained = [i for i, m in zip(ids.ids, ids.mask, strict=True) if m]
    assert tok.decode(trained, skip_special_tokens=False) == "Bonjour</s>"
    assert trained[0] == tok.token_to_id("▁Bon")  # the template's space: "[/INST] Bonjour"
