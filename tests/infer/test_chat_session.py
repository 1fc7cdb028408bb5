"""ChatSession: history, slash commands, context overflow, cancellation (no terminal)."""

import pytest
import torch

from astrai.data.testing import tiny_tokenizer
from astrai.errors import CheckpointError, DataError
from astrai.infer import CacheConfig, Engine, SamplingParams
from astrai.infer.build import EngineOptions
from astrai.infer.chat_session import ChatSession, collect_message, open_chat
from astrai.model import ModelConfig, build_model
from astrai.model.checkpoint import save_checkpoint


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("chat-tok"))


@pytest.fixture(scope="module")
def model(tok):
    cfg = ModelConfig(vocab_size=tok.vocab_size, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                      ffn_dim=128, max_seq_len=256)
    m = build_model(cfg, seed=0)
    with torch.no_grad():  # stop tokens never win a greedy argmax: replies have max_tokens
        m.lm_head.weight[tok.stop_ids] = 0
    return m


def session(model, tok, max_context=None, max_tokens=6, **kw):
    eng = Engine(model, tok, CacheConfig(max_kv_tokens=1024, max_requests=4,
                                         max_context=max_context))
    return ChatSession(eng, tok, SamplingParams(max_tokens=max_tokens, temperature=0.0), **kw)


def test_reply_streams_and_records_history(model, tok):
    s = session(model, tok, system="You are a helpful assistant who answers briefly.")
    r = s.reply("Hello there")
    pieces = list(r)
    assert r.text == "".join(pieces) and r.finish_reason == "length" and r.notice is None
    assert s.messages == [{"role": "user", "content": "Hello there"},
                          {"role": "assistant", "content": r.text}]
    st = s.last
    assert st.output_tokens == 6 and st.ttft > 0 and st.decode_tokens_per_s > 0
    assert st.prompt_tokens == len(tok.encode_chat(
        [{"role": "system", "content": s.system}, {"role": "user", "content": "Hello there"}]))
    # The second turn re-encodes the first: the radix cache serves its full pages.
    list(s.reply("And then?"))
    assert s.last.cached_tokens >= 16 and len(s.messages) == 4
    assert "TTFT" in s.command("/stats").message
    assert f"decode path: {s.engine.stats().decode}" in s.command("/stats").message
    assert not s.engine.has_unfinished()


def test_greedy_reply_matches_the_engine(model, tok):
    s = session(model, tok)
    text = "".join(s.reply("Once more"))
    ids = tok.encode_chat([{"role": "user", "content": "Once more"}])
    want = Engine(model, tok, CacheConfig(max_kv_tokens=1024)).generate(
        ids, SamplingParams(max_tokens=6, temperature=0.0))[0].text
    assert text == want


def test_cancel_keeps_the_partial_reply_and_frees_the_engine(model, tok):
    s = session(model, tok, max_tokens=200)
    r = s.reply("Tell me a long story")
    it = iter(r)
    next(it), next(it), next(it)
    r.cancel()
    assert r.finish_reason == "abort"
    assert s.last.output_tokens == 3 and s.last.finish_reason == "abort"
    assert s.messages[-1] == {"role": "assistant", "content": r.text}
    assert not s.engine.scheduler.has_work()
    assert s.engine.pool.stats().utilization == 0.0  # only cached pages remain
    assert list(it) == []  # the cancelled stream yields nothing more
    r.cancel()  # idempotent
    assert len(s.messages) == 2


def test_set_command_validates(model, tok):
    s = session(model, tok)
    assert s.command("/set temperature 0.3").message == "temperature = 0.3"
    assert s.params.temperature == 0.3
    assert s.command("/set top-k 5").message == "top_k = 5" and s.params.top_k == 5
    assert s.command("/set seed none").message == "seed = None"
    for line, why in [("/set top_p 1.5", "/set top_p 1.5: must be in (0, 1]"),
                      ("/set temperature -1", "must be >= 0"),
                      ("/set max_tokens 0", "must be an integer >= 1"),
                      ("/set top_k 2.5", "must be an integer"),
                      ("/set temperature hot", "must be a number"),
                      ("/set colour blue", "unknown setting"),
                      ("/set top_p", "give a value")]:
        res = s.command(line)
        assert res.error and why in res.message, line
    assert s.params.top_p == 1.0 and s.params.temperature == 0.3  # unchanged by errors
    assert "temperature=0.3" in s.command("/set").message


def test_other_commands(model, tok):
    s = session(model, tok)
    assert s.command("/stats").message == "no reply yet"
    assert s.command("/system Be terse.").message == "system prompt set"
    assert s.system == "Be terse."
    list(s.reply("hi"))
    assert s.command("/reset").message == "conversation reset (1 turn forgotten)"
    assert s.messages == [] and s.system == "Be terse."
    assert s.command("/system").message == "system prompt cleared" and s.system is None
    assert s.command("/exit").exit and s.command("/quit").exit
    assert s.command("/nope").error
    assert "/set KEY VALUE" in s.command("/help").message
    assert s.is_command("/reset") and not s.is_command("//reset")
    assert s.unescape("//reset me") == "/reset me"


def overflow_notices(model, tok):
    """(the session, the notice of each of its six replies): a conversation that outgrows a
    64-token context."""
    s = session(model, tok, max_context=64, max_tokens=8)
    notices = []
    for i in range(6):
        r = s.reply(f"This is message number {i} of a longer conversation")
        list(r)
        notices.append(r.notice)
    return s, notices


def test_context_overflow_drops_the_oldest_turns(model, tok):
    s, notices = overflow_notices(model, tok)
    assert notices[0] is None
    dropped = [n for n in notices if n]
    assert dropped and all("dropped the oldest" in n for n in dropped)
    assert s.messages[-2]["content"].endswith("5 of a longer conversation")
    assert len(s.messages) < 12 and s.messages[0]["role"] == "user"
    assert s.last.prompt_tokens <= 64 - 8
    with pytest.raises(DataError, match="shorten it"):
        s.reply("word " * 100)


def test_no_template_is_one_running_text(model, tok):
    s = session(model, tok, template=False, system="S")
    msgs = [{"role": "user", "content": "u1"}, {"role": "assistant", "content": " r1"},
            {"role": "user", "content": "u2"}]
    assert s.encode(msgs) == tok.encode("S\nu1 r1\nu2", add_special_tokens=True)
    list(s.reply("Once upon a time"))
    assert s.messages[0]["content"] == "Once upon a time"


def test_collect_message_multiline():
    def reader(lines):
        it = iter(lines)

        def read(prompt):
            try:
                return next(it)
            except StopIteration:
                raise EOFError from None
        return read

    assert collect_message(reader(["plain"])) == "plain"
    assert collect_message(reader(["one \\", "two \\", "three"])) == "one \ntwo \nthree"
    assert collect_message(reader(['"""', "a", "", "b", '"""'])) == "a\n\nb"
    assert collect_message(reader(['"""first', 'last"""'])) == "first\nlast"
    assert collect_message(reader(['"""inline"""'])) == "inline"
    assert collect_message(reader(['"""', "cut off"])) == "cut off"
    assert collect_message(reader(["dangling \\"])) == "dangling \n"
    with pytest.raises(EOFError):
        collect_message(reader([]))


def test_open_chat_errors(tmp_path, tok, model):
    with pytest.raises(CheckpointError, match="not a checkpoint directory"):
        open_chat(tmp_path / "missing")
    bare = save_checkpoint(tmp_path / "bare", model, model.config)
    with pytest.raises(CheckpointError, match=r"no tokenizer\.json.*cp DATASET_DIR"):
        open_chat(bare)
    full = save_checkpoint(tmp_path / "full", model, model.config, tokenizer_dir=tok.path)
    s = open_chat(full, EngineOptions(device="cpu"),
                  params=SamplingParams(max_tokens=3, temperature=0.0))
    assert len(list(s.reply("hi"))) == 3


def test_dropped_turns_are_counted_in_words(model, tok):
    import re

    dropped = [n for n in overflow_notices(model, tok)[1] if n]
    assert "the context is full: dropped the oldest turn" in dropped  # one: no "1 turn"
    assert all(re.fullmatch(r"the context is full: dropped the oldest (turn|[2-9]\d* turns)",
                            n) for n in dropped), dropped


def test_chat_serves_lora_adapters_and_switches_between_them(tmp_path):
    """`chat --lora NAME=DIR`: replies use the first adapter, `/lora NAME` switches, `/lora
    none` is the base; each reply equals the engine's own generation under that adapter."""
    pytest.importorskip("peft")
    from .lora_fixtures import make_adapters, tiny_llama

    t = tiny_tokenizer(tmp_path)
    base = tiny_llama(tmp_path, tokenizer_dir=t.path)
    adapters = {k: str(v) for k, v in make_adapters(tmp_path, base).items()}
    s = open_chat(base, EngineOptions(device="cpu", loras=adapters),
                  params=SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    assert s.lora == "sql" and "served: sql, poet" in s.command("/lora").message
    ids = s.encode([{"role": "user", "content": "Hello"}])
    want = {name: s.engine.generate(ids, s.params, lora=name)[0].text
            for name in (None, "sql", "poet")}
    assert len(set(want.values())) == 3  # the adapters change the reply
    for cmd, name in (("", "sql"), ("/lora poet", "poet"), ("/lora none", None)):
        if cmd:
            assert not s.command(cmd).error
        s.command("/reset")
        r = s.reply("Hello")
        assert "".join(r) == want[name] and s.lora == name
    bad = s.command("/lora nope")
    assert bad.error and "not served; use one of sql, poet" in bad.message
