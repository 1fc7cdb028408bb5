"""Many LoRA adapters over one base in one batch (astrai.infer.loras, model/lora_batch.py).

Two PEFT adapters of different ranks and targets on a tiny HF Llama, and the base, asked
for concurrently, give the tokens each gives alone and the tokens transformers + PEFT give
(unmerged) under greedy decoding; the prefix cache never hands a prefix computed under one
adapter to another or to the base; `max_loras` holds requests back without deadlock."""

from __future__ import annotations

import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from astrai.errors import CheckpointError, ConfigError
from astrai.infer import CacheConfig, Engine, SamplingParams
from astrai.infer.loras import Adapter
from astrai.model.hf import load_pretrained
from astrai.model.lora_batch import LoraBank

from .lora_fixtures import VOCAB, make_adapters, peft_greedy, tiny_llama

pytest.importorskip("transformers")
pytest.importorskip("peft")

N = 10
LONG = N + 6
"""The base request that outlives the batch: its last steps are base-only decodes."""
PROMPTS = [[(7 * i + 3 * j) % VOCAB for j in range(5 + 3 * i)] for i in range(3)]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlora")
    base = tiny_llama(root)
    return base, make_adapters(root, base)


@pytest.fixture(scope="module")
def reference(dirs):
    """(prompt index, adapter name or None) -> transformers/PEFT greedy tokens."""
    base, adapters = dirs
    out = {}
    for i, p in enumerate(PROMPTS):
        for name in (None, *adapters):
            toks, gap = peft_greedy(base, adapters.get(name), p, LONG)
            assert gap > 1e-3, "the test model's logits are too close to call"
            out[i, name] = toks[:N]
            out[i, name, "long"] = toks
    return out


def make_engine(dirs, **kw):
    base, adapters = dirs
    model, _, _ = load_pretrained(base)
    cache = kw.pop("cache", CacheConfig(page_size=4, max_kv_tokens=2048, max_requests=16))
    return Engine(model.eval(), None, cache, loras={k: str(v) for k, v in adapters.items()},
                  **kw)


def combos():
    return [(i, name) for i in range(len(PROMPTS)) for name in (None, "sql", "poet")]


def test_adapters_change_the_tokens(reference):
    for i in range(len(PROMPTS)):
        assert reference[i, "sql"] != reference[i, None]
        assert reference[i, "poet"] != reference[i, None]
        assert reference[i, "sql"] != reference[i, "poet"]


@pytest.mark.parametrize("decode", ["eager", "static"])
def test_one_batch_of_base_and_adapters_equals_peft(dirs, reference, decode):
    eng = make_engine(dirs, decode=decode)
    static_steps = []
    fast = eng.decode_path.fast
    if fast is not None:  # the static step (eager decode: none)
        run = fast.run
        fast.run = lambda batch: (static_steps.append(batch), run(batch))[1]
    cs = combos()
    params = [SamplingParams.greedy(N)] * len(cs) + [SamplingParams.greedy(LONG)]
    outs = eng.generate([PROMPTS[i] for i, _ in cs] + [PROMPTS[0]], params,
                        lora=[name for _, name in cs] + [None])
    for (i, name), o in zip(cs, outs):
        assert o.token_ids == reference[i, name], (i, name)
    assert outs[-1].token_ids == reference[0, None, "long"]
    assert eng.stats().peak_running == len(cs) + 1  # they really shared the batch
    assert eng.stats().decode == decode
    # adapter rows never take the static step; the lone base decodes at the end do (one
    # more when it waited a step to share the prompt page of the base request before it)
    assert all(c.req.lora is None for b in static_steps for c in b.chunks)
    if decode == "static":
        assert LONG - N <= len(static_steps) <= LONG - N + 1
    else:
        assert not static_steps


def test_each_alone_equals_the_batch(dirs, reference):
    eng = make_engine(dirs)
    for i, name in combos():
        rid = eng.add_request(PROMPTS[i], SamplingParams.greedy(N), lora=name)
        while eng.has_unfinished():
            outs = [o for o in eng.step() if o.request_id == rid and o.finished]
        assert outs[-1].token_ids == reference[i, name]


def test_prefix_cache_is_keyed_by_adapter(dirs, reference):
    eng = make_engine(dirs)
    p = PROMPTS[2]  # 11 tokens: two complete pages of 4 are cached
    (base,) = eng.generate([p], SamplingParams.greedy(N))
    (sql,) = eng.generate([p], SamplingParams.greedy(N), lora="sql")
    assert sql.token_ids == reference[2, "sql"] and sql.usage.cached_tokens == 0
    (poet,) = eng.generate([p], SamplingParams.greedy(N), lora="poet")
    assert poet.token_ids == reference[2, "poet"] and poet.usage.cached_tokens == 0
    (again,) = eng.generate([p], SamplingParams.greedy(N), lora="sql")
    assert again.token_ids == reference[2, "sql"] and again.usage.cached_tokens >= 8
    (base2,) = eng.generate([p], SamplingParams.greedy(N))
    assert base2.token_ids == base.token_ids == reference[2, None]
    assert base2.usage.cached_tokens >= 8


def test_max_loras_one_holds_requests_back_without_deadlock(dirs, reference):
    eng = make_engine(dirs, max_loras=1)
    cs = combos() * 2
    outs = eng.generate([PROMPTS[i] for i, _ in cs], SamplingParams.greedy(N),
                        lora=[name for _, name in cs])
    for (i, name), o in zip(cs, outs):
        assert o.token_ids == reference[i, name], (i, name)
    assert eng.loras.resident() in (["sql"], ["poet"])


def test_add_and_remove_at_runtime(dirs, reference):
    base, adapters = dirs
    model, _, _ = load_pretrained(base)
    eng = Engine(model.eval(), None, CacheConfig(page_size=4, max_kv_tokens=1024,
                                                 max_requests=8), max_loras=2)
    with pytest.raises(ConfigError, match="lora 'sql' is not loaded"):
        eng.add_request(PROMPTS[0], SamplingParams.greedy(N), lora="sql")
    eng.add_lora("sql", adapters["sql"])
    with pytest.raises(ConfigError, match="already loaded"):
        eng.add_lora("sql", adapters["sql"])
    (o,) = eng.generate([PROMPTS[0]], SamplingParams.greedy(N), lora="sql")
    assert o.token_ids == reference[0, "sql"]
    eng.remove_lora("sql")
    assert eng.lora_names() == [] and eng.loras.resident() == [None, None]
    eng.add_lora("sql", adapters["poet"])  # the same name, other weights: no stale prefix
    (o,) = eng.generate([PROMPTS[0]], SamplingParams.greedy(N), lora="sql")
    assert o.token_ids == reference[0, "poet"] and o.usage.cached_tokens == 0
    with pytest.raises(CheckpointError, match="adapter_config.json"):
        eng.add_lora("x", base)


def test_removing_an_adapter_in_use_lets_its_requests_finish(dirs, reference):
    eng = make_engine(dirs)
    rid = eng.add_request(PROMPTS[1], SamplingParams.greedy(N), lora="poet")
    eng.step()
    eng.remove_lora("poet")
    last = None
    while eng.has_unfinished():
        last = next((o for o in eng.step() if o.request_id == rid), last)
    assert last.finished and last.token_ids == reference[1, "poet"]
    assert "poet" not in eng.loras.resident()


def test_an_adapter_for_another_base_is_refused(dirs, tmp_path):
    import transformers

    from .lora_fixtures import peft_adapter

    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "small")
    bad = peft_adapter(tmp_path / "small", tmp_path / "bad", 4, 8.0, ["q_proj"], False, 0)
    eng = make_engine(dirs)
    with pytest.raises(CheckpointError, match="wrong shape"):
        eng.add_lora("bad", bad)


def test_preempted_adapter_requests_resume_under_their_adapter(dirs, reference):
    cache = CacheConfig(page_size=4, max_kv_tokens=64, max_requests=16, max_context=64)
    eng = make_engine(dirs, cache=cache, max_loras=2)
    cs = combos()
    outs = eng.generate([PROMPTS[i] for i, _ in cs], SamplingParams.greedy(N),
                        lora=[name for _, name in cs])
    assert eng.stats().num_preemptions > 0
    for (i, name), o in zip(cs, outs):
        assert o.token_ids == reference[i, name], (i, name)
    assert eng.loras._refs == [0, 0]  # every slot released


# -- one tenant cannot break the others ------------------------------------------------------


class GemmWork(TorchDispatchMode):
    """Multiply-adds of every matrix product run inside the block (mm, addmm, addmm_)."""

    def __init__(self) -> None:
        super().__init__()
        self.macs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm", "addmm_"):
            a, b = args[:2] if name == "mm" else args[1:3]
            self.macs += a.shape[0] * a.shape[1] * b.shape[1]
        return func(*args, **(kwargs or {}))


def sql_work(eng) -> int:
    """The matrix work of one sql request from an empty prefix cache."""
    eng.reset_prefix_cache()
    with GemmWork() as work:
        (o,) = eng.generate([PROMPTS[1]], SamplingParams.greedy(N), lora="sql")
    return work.macs, o.token_ids


def test_a_high_rank_adapter_costs_the_others_nothing_once_idle_or_gone(dirs, reference,
                                                                       tmp_path):
    """Work per step follows each token's own adapter: a rank-64 adapter resident but idle,
    or unloaded, leaves an sql request's matrix work what it was before it came, and the
    bank shrinks back to what is resident."""
    from .lora_fixtures import peft_adapter

    base, _ = dirs
    big = peft_adapter(base, tmp_path / "big", 64, 64.0, ["q_proj", "k_proj", "v_proj",
                                                         "o_proj", "down_proj"], False, 9)
    eng = make_engine(dirs, max_loras=2, max_lora_rank=64)
    before, tokens = sql_work(eng)
    assert tokens == reference[1, "sql"]
    sql_bytes = eng.loras.bank_bytes()
    eng.add_lora("big", big)
    outs = eng.generate([PROMPTS[0], PROMPTS[1]], SamplingParams.greedy(N), lora=["big", "sql"])
    assert outs[1].token_ids == reference[1, "sql"]
    assert sorted(n for n in eng.loras.resident() if n) == ["big", "sql"]
    assert sql_work(eng) == (before, reference[1, "sql"])  # big resident, idle
    eng.remove_lora("big")
    assert eng.loras.bank_bytes() == sql_bytes
    assert sql_work(eng) == (before, reference[1, "sql"])  # big gone


def test_rank_count_and_name_bounds(dirs):
    base, adapters = dirs
    model, _, _ = load_pretrained(base)
    eng = Engine(model.eval(), None, CacheConfig(page_size=4, max_kv_tokens=512,
                                                 max_requests=4),
                 max_lora_rank=4, max_loaded_loras=2)
    with pytest.raises(CheckpointError, match="r 8 is above the largest rank served, 4"):
        eng.add_lora("poet", adapters["poet"])  # rank 8
    eng.add_lora("a", adapters["sql"])
    eng.add_lora("org/sql-v2.1", adapters["sql"])
    with pytest.raises(ConfigError, match="2 adapters are loaded.*max_loaded_loras"):
        eng.add_lora("c", adapters["sql"])
    eng.remove_lora("a")
    eng.add_lora("c", adapters["sql"])
    assert eng.lora_names() == ["org/sql-v2.1", "c"]
    eng.remove_lora("c")
    for bad in ["x\ny", "a b", "tab\t", "", "x" * 129, "é", "nul\x00", "-x", ".hidden", 7]:
        with pytest.raises(ConfigError, match="lora name"):
            eng.add_lora(bad, adapters["sql"])
    assert eng.lora_names() == ["org/sql-v2.1"]


def test_adapter_names_are_read_without_the_engine_lock(dirs):
    """A long step holds the engine's lock; listing the adapters must not wait for it."""
    eng = make_engine(dirs)
    got = []
    with eng.lock:  # a step in progress
        reader = threading.Thread(target=lambda: got.append(eng.lora_names()), daemon=True)
        reader.start()
        reader.join(10)
    assert got == [["sql", "poet"]]


def nan_adapter(eng, like: str) -> Adapter:
    """An adapter whose every A holds NaN, registered past the load checks (which refuse
    it): what a check that missed something would let through."""
    good = eng.loras.get(like)
    tensors = {m: (torch.full_like(a, float("nan")), b) for m, (a, b) in good.tensors.items()}
    return eng.loras.register(Adapter("nan", "-", good.spec, tensors, "lora-nan"))


@pytest.mark.parametrize("decode", ["eager", "static"])
def test_a_nan_adapter_leaves_the_other_rows_of_its_batch_alone(dirs, reference, decode):
    eng = make_engine(dirs, max_loras=3, decode=decode)
    nan_adapter(eng, "poet")
    cs = [(i, name) for i in range(len(PROMPTS)) for name in (None, "sql", "nan")]
    outs = eng.generate([PROMPTS[i] for i, _ in cs], SamplingParams.greedy(N),
                        lora=[name for _, name in cs])
    assert eng.stats().peak_running == len(cs)  # one batch
    for (i, name), o in zip(cs, outs):
        if name != "nan":
            assert o.token_ids == reference[i, name], (i, name)
    assert not eng.has_unfinished() and eng.pool.stats().utilization == 0.0


def test_an_adapter_that_cannot_take_a_slot_fails_alone(dirs, reference, monkeypatch):
    """Its requests end with "error" while still waiting; every other request, waiting or
    running, gets its tokens, and nothing is left held."""
    eng = make_engine(dirs)
    poet = eng.loras.get("poet")
    real = LoraBank.write

    def write(self, slot, scale, tensors):
        if tensors is poet.tensors:
            raise ZeroDivisionError("float division by zero")
        return real(self, slot, scale, tensors)

    monkeypatch.setattr(LoraBank, "write", write)
    cs = combos()
    outs = eng.generate([PROMPTS[i] for i, _ in cs], SamplingParams.greedy(N),
                        lora=[name for _, name in cs])
    for (i, name), o in zip(cs, outs):
        if name == "poet":
            assert o.finish_reason == "error" and "ZeroDivisionError" in o.error
            assert o.token_ids == []
        else:
            assert o.token_ids == reference[i, name], (i, name)
    assert not eng.has_unfinished() and eng.pool.stats().utilization == 0.0
    assert eng.loras._refs == [0, 0] and "poet" not in eng.loras.resident()
    monkeypatch.undo()
    (o,) = eng.generate([PROMPTS[0]], SamplingParams.greedy(N), lora="poet")
    assert o.token_ids == reference[0, "poet"]


def test_a_schedule_failing_mid_admission_fails_waiting_and_running_alike(dirs, reference,
                                                                          monkeypatch):
    """The scheduler raises after admitting one request of the round: every request ends
    with "error" exactly once (the half-admitted, the running and the still waiting), none
    is left queued or holding pages, and the engine serves the next request."""
    eng = make_engine(dirs)
    rids = [eng.add_request(PROMPTS[i], SamplingParams.greedy(N), lora=name)
            for i, name in combos()[:4]]
    real, calls = eng.pool.reserve, []

    def reserve(handle, n):
        calls.append(n)
        if len(calls) == 2:
            raise RuntimeError("reserve failed")
        return real(handle, n)

    monkeypatch.setattr(eng.pool, "reserve", reserve)
    with pytest.raises(RuntimeError, match="reserve failed"):
        eng.step()
    monkeypatch.undo()
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    assert sorted(o.request_id for o in outs) == sorted(rids)
    assert all(o.finish_reason == "error" and "reserve failed" in o.error for o in outs)
    assert not eng.scheduler.waiting and not eng.scheduler.running
    assert eng.pool.stats().utilization == 0.0 and eng.loras._refs == [0, 0]
    (o,) = eng.generate([PROMPTS[2]], SamplingParams.greedy(N), lora="sql")
    assert o.token_ids == reference[2, "sql"]


def tagged_kernels(tag: str, calls: list, gate=None):
    """Python stand-ins for the CPU decode kernels (torch's products, so no C++ build or ISA
    matters) that record (tag, thread) for every product they take; `gate(thread)` runs
    first, to hold a thread at a chosen point of its forward."""
    import torch.nn.functional as F

    from astrai.model.fast_path import DecodeKernels

    def note():
        calls.append((tag, threading.get_ident()))
        if gate is not None:
            gate()

    def one(x, w, b):
        note()
        return F.linear(x, w.to(x.dtype), b)

    def many(x, ws, bs):
        note()
        return [F.linear(x, w.to(x.dtype), b) for w, b in zip(ws, bs)]

    def q8(x, q, s, b):
        raise AssertionError("no int8 weights here")

    return DecodeKernels(tag, one, q8, many, lambda *a: q8(*a), fp32_rows=(1, 16))


def test_two_engines_on_two_threads_never_see_each_others_kernels_or_adapters(dirs,
                                                                            reference):
    """Two engines over one base module, each with its own adapter and its own kernels,
    stepped from two threads: thread A is held inside its first product until B is inside
    its own, then A finishes while B waits. A process-wide kernel or adapter slot would
    hand A's remaining products to B's kernels and B's adapter selection (B entered last);
    per-pass contexts keep each engine's own, and each gives the tokens it gives alone."""
    base, adapters = dirs
    model, _, _ = load_pretrained(base)
    model.eval()
    cache = CacheConfig(page_size=4, max_kv_tokens=512, max_requests=4)
    a_in, b_in, a_done = threading.Event(), threading.Event(), threading.Event()
    ident: dict[str, int] = {}

    def gate_a():
        if not a_in.is_set() and threading.get_ident() == ident.get("A"):
            a_in.set()
            assert b_in.wait(60)

    def gate_b():
        if not b_in.is_set() and threading.get_ident() == ident.get("B"):
            b_in.set()
            assert a_done.wait(60)

    calls: list = []
    eng_a = Engine(model, None, cache, loras={"sql": str(adapters["sql"])},
                   kernels=tagged_kernels("A", calls, gate_a), decode="eager")
    eng_b = Engine(model, None, cache, loras={"poet": str(adapters["poet"])},
                   kernels=tagged_kernels("B", calls, gate_b), decode="eager")
    got: dict[str, list[int]] = {}

    def run(tag, eng, lora):
        ident[tag] = threading.get_ident()
        try:
            got[tag] = eng.generate(PROMPTS[2], SamplingParams.greedy(N), lora=lora)[0].token_ids
        finally:
            if tag == "A":
                a_done.set()
            b_in.set()  # never leave A waiting on a B that failed

    ta = threading.Thread(target=run, args=("A", eng_a, "sql"))
    tb = threading.Thread(target=run, args=("B", eng_b, "poet"))
    ta.start()
    assert a_in.wait(60)
    tb.start()
    ta.join(120)
    tb.join(120)
    assert got == {"A": reference[2, "sql"], "B": reference[2, "poet"]}
    assert {tag for tag, t in calls if t == ident["A"]} == {"A"}
    assert {tag for tag, t in calls if t == ident["B"]} == {"B"}
