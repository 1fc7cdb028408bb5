"""The Engine API: streaming, threads, cancellation, the real tokenizer (stop strings
across tokens, EOS), checkpoints, HF directories, and bad input."""

from __future__ import annotations

import threading

import pytest
import torch

from astrai.data.testing import tiny_tokenizer
from astrai.errors import ConfigError, DataError
from astrai.infer import CacheConfig, Engine, SamplingParams, SchedulerConfig
from astrai.model import build_model
from astrai.model.checkpoint import save_checkpoint

from .conftest import naive_greedy, random_prompts, small_config


def make(model, tokenizer=None, **sched):
    cache = CacheConfig(page_size=4, max_kv_tokens=2048, max_requests=8)
    return Engine(model, tokenizer, cache, scheduler_config=SchedulerConfig(**sched))


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=512)


@pytest.fixture(scope="module")
def text_model(tok):
    return build_model(small_config(vocab_size=tok.vocab_size), seed=3).eval()


def test_stream_deltas_add_up_to_the_final_output(text_model, tok):
    eng = make(text_model, tok)
    prompts = ["To be, or not to be", "Once more unto the breach"]
    params = SamplingParams.greedy(16, ignore_eos=True)
    deltas = list(eng.generate(prompts, params, stream=True))
    final = eng.generate(prompts, params)
    for i, f in enumerate(final):
        mine = [d for d in deltas if d.index == i]
        assert [t for d in mine for t in d.delta_token_ids] == f.token_ids
        assert "".join(d.delta_text for d in mine) == f.text == tok.decode(f.token_ids)
        assert mine[-1].finished and not any(d.finished for d in mine[:-1])
        m = f.metrics
        assert len(m.token_times) == 16 and m.ttft > 0 and m.e2e >= m.ttft and m.tpot >= 0
        assert f.usage.prompt_tokens == len(tok.encode(prompts[i]))


def test_stop_string_spanning_tokens(text_model, tok):
    eng = make(text_model, tok)
    prompt = "Now is the winter of our discontent"
    full = eng.generate(prompt, SamplingParams.greedy(60, ignore_eos=True))[0]
    pieces = [tok.decode(full.token_ids[:i + 1]) for i in range(len(full.token_ids))]
    text = full.text
    # a stop string made of the last character of one token and the first of the next,
    # where neither holds a partial UTF-8 character (a random model emits those)
    for i in range(1, len(pieces) - 1):
        a, b, c = (len(pieces[j]) for j in (i - 1, i, i + 1))
        stop = text[b - 1:b + 1]
        if (b > a and c > b and "\ufffd" not in pieces[i + 1][a:] and pieces[i + 1] == text[:c]
                and text.find(stop) == b - 1 and stop.strip()):
            break
    else:
        pytest.skip("no clean token boundary with a unique two-character stop string")
    out = eng.generate(prompt, SamplingParams.greedy(60, ignore_eos=True, stop=[stop]))[0]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert out.text == text[:b - 1]
    assert out.token_ids == full.token_ids[:i + 2]  # ended on the token completing it
    inc = eng.generate(prompt, SamplingParams.greedy(60, ignore_eos=True, stop=[stop],
                                                     include_stop_str_in_output=True))[0]
    assert inc.text == text[:b + 1]


class _EosAt:
    """The real tokenizer with another EOS id (to make a random model stop)."""

    def __init__(self, tok, eos):
        self._tok, self.eos_id, self.stop_ids = tok, eos, [eos]

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_eos_stops_and_is_not_in_the_text(text_model, tok):
    prompt = "Good morrow"
    full = make(text_model, tok).generate(prompt, SamplingParams.greedy(12))[0]
    eos = full.token_ids[5]
    cut = full.token_ids.index(eos)
    out = make(text_model, _EosAt(tok, eos)).generate(prompt, SamplingParams.greedy(12))[0]
    assert out.finish_reason == "stop" and out.stop_reason == eos
    assert out.token_ids == full.token_ids[:cut + 1]
    assert out.text == tok.decode(full.token_ids[:cut])
    ignored = make(text_model, _EosAt(tok, eos)).generate(
        prompt, SamplingParams.greedy(12, ignore_eos=True))[0]
    assert ignored.token_ids == full.token_ids


def test_concurrent_streams_from_threads(model):
    prompts = random_prompts((7, 3, 12, 5), seed=11)
    expected = [naive_greedy(model, p, 10) for p in prompts]
    eng = make(model)
    got, errors = {}, []

    def worker(i):
        try:
            toks = []
            for d in eng.generate(prompts[i], SamplingParams.greedy(10), stream=True):
                toks += d.delta_token_ids
            got[i] = toks
        except Exception as e:  # noqa: BLE001 - surfaced in the main thread below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and [got[i] for i in range(4)] == expected


def test_abort_from_another_thread_frees_kv(model):
    eng = make(model)
    seen, aborted = threading.Event(), threading.Event()
    outs = []

    def consume():
        for d in eng.generate(random_prompts((9,))[0], SamplingParams.greedy(200), stream=True):
            outs.append(d)
            if len(outs) == 3:  # hold the stream (no steps run) until the abort is in,
                seen.set()      # so the request cannot finish first on a busy machine
                aborted.wait(30)

    t = threading.Thread(target=consume)
    t.start()
    assert seen.wait(30)
    try:
        assert eng.abort(outs[0].request_id)
    finally:
        aborted.set()
    t.join(30)
    assert outs[-1].finished and outs[-1].finish_reason == "abort" and len(outs) < 200
    a = eng.pool.allocator
    assert a.num_free() + a.num_evictable() == a.num_pages and eng.stats().num_running == 0


def test_closing_a_stream_early_aborts(model):
    eng = make(model)
    it = eng.generate(random_prompts((5,))[0], SamplingParams.greedy(100), stream=True)
    next(it)
    it.close()
    assert not eng.has_unfinished() or eng.step() is not None
    assert eng.stats().num_running == 0 and eng.stats().num_waiting == 0


def test_step_api_with_add_request(model):
    eng = make(model)
    p = random_prompts((6,), seed=1)[0]
    rid = eng.add_request(p, SamplingParams.greedy(5), request_id="mine")
    assert rid == "mine"
    with pytest.raises(ConfigError, match="already in use"):
        eng.add_request(p, request_id="mine")
    toks = []
    while eng.has_unfinished():
        for o in eng.step():
            toks += o.delta_token_ids
    assert toks == naive_greedy(model, p, 5)


def test_bad_input_is_a_clear_error(model, text_model, tok):
    eng = make(model)
    with pytest.raises(DataError, match="empty"):
        eng.add_request([])
    with pytest.raises(DataError, match="outside the vocabulary"):
        eng.add_request([1, 999])
    with pytest.raises(ConfigError, match="needs a tokenizer"):
        eng.add_request("hello")
    with pytest.raises(ConfigError, match="stop strings need a tokenizer"):
        eng.add_request([1, 2], SamplingParams(stop=["x"]))
    with pytest.raises(ConfigError, match="temperature"):
        eng.add_request([1, 2], SamplingParams(temperature=-1))
    with pytest.raises(ConfigError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(DataError, match="context holds 256"):
        eng.add_request(list(range(256)))
    with pytest.raises(ConfigError, match="max_context"):
        Engine(model, None, CacheConfig(max_context=10_000))
    with pytest.raises(ConfigError, match="max_kv_tokens"):
        Engine(model, None, CacheConfig(max_kv_tokens=64))
    trunc = make(model, prompt_overflow="truncate")
    long = random_prompts((300,), seed=2)[0]
    out = trunc.generate(long, SamplingParams.greedy(3))[0]
    assert out.prompt_truncated and out.usage.prompt_tokens == 255
    assert out.finish_reason == "length" and len(out.token_ids) == 1  # the context is full


def test_from_checkpoint_round_trip(tmp_path, text_model, tok):
    ckpt = save_checkpoint(tmp_path / "ckpt", text_model, text_model.config,
                           tokenizer_dir=tok.path)
    eng = Engine.from_checkpoint(ckpt, device="cpu",
                                 cache_config=CacheConfig(max_kv_tokens=1024))
    params = SamplingParams.greedy(8, ignore_eos=True)
    a = eng.generate("Friends, Romans", params)[0]
    b = make(text_model, tok).generate("Friends, Romans", params)[0]
    assert a.token_ids == b.token_ids and a.text == b.text != ""


def test_greedy_matches_transformers_on_a_hf_llama_directory(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # sharp random weights: no near-ties in the greedy choices
        for name, p in hf.named_parameters():
            n = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.2 * n if name.endswith("norm.weight") else 0.2 * n)
    hf.save_pretrained(tmp_path / "llama")
    eng = Engine.from_checkpoint(tmp_path / "llama", device="cpu",
                                 cache_config=CacheConfig(max_kv_tokens=1024))
    prompts = random_prompts((4, 13, 30), seed=8)
    ours = eng.generate(prompts, SamplingParams.greedy(12))
    for p, o in zip(prompts, ours):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False,
                              min_new_tokens=12, pad_token_id=0)
        assert o.token_ids == ref[0, len(p):].tolist()
