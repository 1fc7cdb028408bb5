"""The lm-eval model `astrai` against lm-eval's own `hf` model (HFLM) on the exported HF
twin of the same checkpoint: per-request log-likelihoods, rolling totals, generations."""

import pytest

pytest.importorskip("lm_eval")
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model
from lm_eval.models.huggingface import HFLM

from astrai.eval.harness import AstraiLM

LONG = ("Friends, Romans, countrymen, lend me your ears; I come to bury Caesar, not to "
        "praise him. The evil that men do lives after them; the good is oft interred with "
        "their bones. ") * 2


@pytest.fixture(scope="module")
def pair(ckpt, hf_dir):
    return (AstraiLM(str(ckpt), device="cpu"),
            HFLM(pretrained=str(hf_dir), device="cpu", dtype="float32", batch_size=4))


def reqs(kind, args):
    return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


def test_registered_under_astrai():
    assert get_model("astrai") is AstraiLM


def test_loglikelihood_equals_hflm(pair):
    ours, hf = pair
    choices = [" countrymen", " friends", " Caesar", " the"]
    args = [("Friends, Romans,", c) for c in choices]  # one shared context
    args += [("", "hello world"), ("To be, or not ", "to be"), (LONG, " him."),  # truncated
             ("The king", " is dead")]
    r = reqs("loglikelihood", args)
    got, ref = ours.loglikelihood(r), hf.loglikelihood(r)
    for (lp, g), (rlp, rg) in zip(got, ref, strict=True):
        assert lp == pytest.approx(rlp, abs=1e-4)
        assert g == rg


def test_loglikelihood_rolling_equals_hflm(pair):
    ours, hf = pair
    r = reqs("loglikelihood_rolling", [(LONG,), ("Short text.",), (LONG[:150],)])
    for a, b in zip(ours.loglikelihood_rolling(r), hf.loglikelihood_rolling(r), strict=True):
        assert a == pytest.approx(b, abs=1e-3)  # sums of ~200 tokens


def test_generate_until_equals_hflm(pair):
    ours, hf = pair
    gen = {"until": ["e"], "max_gen_toks": 12, "do_sample": False}
    r = reqs("generate_until", [("Friends, Romans,", gen), ("To be or", gen),
                                ("O Romeo", {"until": ["\n"], "max_gen_toks": 5}),
                                (LONG, {"until": ["."], "max_gen_toks": 8})])
    got = ours.generate_until(r)
    assert got == hf.generate_until(r)
    assert any(got[:2]) and all("e" not in g for g in got[:2])  # the stop string cut them


def test_chat_template_is_the_tokenizer_s(pair, tok):
    ours, _ = pair
    msgs = [{"role": "user", "content": "Hi"}]
    assert ours.apply_chat_template(msgs) == tok.render_chat(msgs, add_generation_prompt=True)
    assert ours.chat_template(True) == tok.chat_template
    text = ours.apply_chat_template(msgs)
    assert ours.tok_encode(text)[:1] == tok.encode(text, add_special_tokens=True)[:1]
