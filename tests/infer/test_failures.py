"""An error while serving one request ends that request alone (finish_reason "error", the
message in its output); the other requests, and the engine, go on."""

from __future__ import annotations

import pytest

from astrai.infer import CacheConfig, Engine, SamplingParams
from astrai.infer.backends.torch_native import TorchNativeBackend
from astrai.infer.sampler import Sampler

from .conftest import naive_greedy, random_prompts

NEW = 6


def make(model, backend=None):
    return Engine(model, None, CacheConfig(page_size=4, max_kv_tokens=1024, max_requests=8),
                  backend)


def assert_no_leak(eng):
    assert not eng.has_unfinished() and eng.pool.stats().utilization == 0.0


def test_a_failing_draw_ends_only_its_request(model, monkeypatch):
    """The bad request is drawn in the same batch as the others, in another caller's
    stream; after its failure every other request still gets exactly its greedy tokens."""
    prompts = random_prompts((9, 4, 13), seed=5)
    eng = make(model)
    real = Sampler.sample
    BAD = SamplingParams.greedy(NEW + 1)  # how the sampler below knows the bad request

    def sample(self, logits, reqs):
        if any(r.params is BAD for r in reqs):
            raise RuntimeError("cannot draw for this one")
        return real(self, logits, reqs)

    monkeypatch.setattr(Sampler, "sample", sample)
    mine = eng.generate(prompts[:2], SamplingParams.greedy(NEW), stream=True)
    first = next(mine)  # the first step is under way: now another caller's request joins
    theirs = eng.generate(prompts[2], BAD, stream=True)
    outs = [first, *mine]
    bad = list(theirs)
    assert len(bad) == 1 and bad[0].finished and bad[0].finish_reason == "error"
    assert "cannot draw for this one" in bad[0].error and bad[0].token_ids == []
    good = [o for o in outs if o.finished]
    assert [o.token_ids for o in good] == [naive_greedy(model, p, NEW) for p in prompts[:2]]
    assert all(o.finish_reason == "length" and o.error is None for o in good)
    assert_no_leak(eng)
    assert eng.generate(prompts[2], SamplingParams.greedy(2))[0].token_ids == \
        naive_greedy(model, prompts[2], 2)


def test_a_failing_detokenizer_ends_only_its_request(model):
    class Decoder:
        def __init__(self, fail):
            self.fail = fail

        def push(self, t):
            if self.fail:
                raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
            return f"<{t}>"

        def flush(self):
            return ""

    class Tok:  # token ids in, one decoder per request; the second one breaks
        eos_id, stop_ids = None, []

        def __init__(self):
            self.n = 0

        def stream_decoder(self):
            self.n += 1
            return Decoder(self.n == 2)

    prompts = random_prompts((5, 7, 3), seed=8)
    eng = Engine(model, Tok(), CacheConfig(page_size=4, max_kv_tokens=1024))
    outs = eng.generate(prompts, SamplingParams.greedy(NEW))
    assert [o.finish_reason for o in outs] == ["length", "error", "length"]
    assert "UnicodeDecodeError" in outs[1].error
    for p, o in zip(prompts[::2], outs[::2]):
        assert o.token_ids == naive_greedy(model, p, NEW)
        assert o.text == "".join(f"<{t}>" for t in o.token_ids)
    assert_no_leak(eng)


class Breaks(TorchNativeBackend):
    """Attends like torch_native except in the steps it is told to fail."""

    name = "breaks"

    def __init__(self):
        super().__init__()
        self.fail = False

    def attend(self, q, k, v, layer, ctx):
        if self.fail:
            raise RuntimeError("device lost")
        return super().attend(q, k, v, layer, ctx)


def test_a_failed_forward_fails_its_step_and_the_engine_recovers(model):
    backend = Breaks()
    eng = make(model, backend)
    prompts = random_prompts((6, 11), seed=9)
    rids = [eng.add_request(p, SamplingParams.greedy(NEW)) for p in prompts]
    eng.step()
    backend.fail = True
    with pytest.raises(RuntimeError, match="device lost"):
        eng.step()
    backend.fail = False
    outs = eng.step()  # the failed step's requests report it here
    assert sorted(o.request_id for o in outs) == sorted(rids)
    assert all(o.finished and o.finish_reason == "error" and "device lost" in o.error
               for o in outs)
    assert_no_leak(eng)
    got = eng.generate(prompts, SamplingParams.greedy(NEW))
    assert [o.token_ids for o in got] == [naive_greedy(model, p, NEW) for p in prompts]


def test_a_failed_forward_reaches_every_stream(model):
    """Each caller's stream ends with its own "error" output, whoever ran the step."""
    backend = Breaks()
    eng = make(model, backend)
    a = eng.generate(random_prompts((5,), seed=1), SamplingParams.greedy(NEW), stream=True)
    b = eng.generate(random_prompts((8,), seed=2), SamplingParams.greedy(NEW), stream=True)
    next(a)
    backend.fail = True
    with pytest.raises(RuntimeError, match="device lost"):
        next(a)
    tail = list(b)
    assert tail and tail[-1].finished and tail[-1].finish_reason == "error"
    assert eng.step() and not eng.has_unfinished()  # the failed step's outputs, once
    assert eng.pool.stats().utilization == 0.0


def test_a_failed_schedule_fails_every_request_and_the_engine_recovers(model, monkeypatch):
    eng = make(model)
    prompts = random_prompts((4, 7), seed=3)
    rids = [eng.add_request(p, SamplingParams.greedy(NEW)) for p in prompts]
    monkeypatch.setattr(eng.scheduler, "schedule", lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        eng.step()
    monkeypatch.undo()
    outs = eng.step()
    assert sorted(o.request_id for o in outs) == sorted(rids)
    assert all(o.finish_reason == "error" and "ZeroDivisionError" in o.error for o in outs)
    assert_no_leak(eng)


def test_the_serve_loop_fails_only_the_failed_steps_requests(model):
    """One row at a time: the first request's step fails; the queued one, not in that step,
    still finishes with its greedy tokens."""
    import threading

    from astrai.infer import SchedulerConfig
    from astrai.serve.loop import EngineLoop

    class FailsOnce(Breaks):
        def attend(self, q, k, v, layer, ctx):
            if self.fail:
                self.fail = False
                raise RuntimeError("device lost")
            return super().attend(q, k, v, layer, ctx)

    backend = FailsOnce()
    backend.fail = True
    eng = Engine(model, None, CacheConfig(page_size=4, max_kv_tokens=1024, max_requests=8),
                 backend, scheduler_config=SchedulerConfig(max_running=1))
    a, b = random_prompts((5, 6), seed=4)
    got: dict[str, list] = {"a": [], "b": []}
    done = {k: threading.Event() for k in got}

    def sink(key):
        def deliver(item):
            got[key].append(item)
            if isinstance(item, BaseException) or item.finished:
                done[key].set()
        return deliver

    loop = EngineLoop(eng, max_in_flight=8)
    loop.submit([("a", a, SamplingParams.greedy(NEW))], sink("a"))  # both are added
    loop.submit([("b", b, SamplingParams.greedy(NEW))], sink("b"))  # before the first step
    loop.start()
    try:
        assert done["a"].wait(60) and done["b"].wait(60)
    finally:
        loop.stop(10)
    assert got["a"][-1].finish_reason == "error" and "device lost" in got["a"][-1].error
    assert got["b"][-1].finish_reason == "length"
    assert got["b"][-1].token_ids == naive_greedy(model, b, NEW)
