"""Engine: the streaming inference API over scheduler, KV pool, model runner and sampler.

    engine = Engine(model, tokenizer, CacheConfig(...))
    rid = engine.add_request("Hello", SamplingParams(max_tokens=32))
    while engine.has_unfinished(): outputs = engine.step()       # deltas per step
    for delta in engine.generate(prompts, params, stream=True): ...

A step reads as schedule -> run -> sample -> postprocess (nano-vllm). The engine is
thread-safe: requests may be added or aborted from any thread, and several threads may each
iterate their own `generate` stream; whichever needs output drives the next step.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from numbers import Integral
from pathlib import Path
from typing import Any

import torch

from astrai.errors import ConfigError, DataError
from astrai.infer.backends.registry import BackendChain, select_backend
from astrai.infer.cache.pool import PagePool
from astrai.infer.config import CacheConfig, SchedulerConfig
from astrai.infer.metrics import EngineStats, StepInfo
from astrai.infer.params import SamplingParams
from astrai.infer.request import Request, RequestOutput, Usage
from astrai.infer.runner import ModelRunner
from astrai.infer.sampler import Sampler
from astrai.infer.scheduler import Scheduler
from astrai.infer.text import TextStream

log = logging.getLogger("astrai.infer")
Prompt = str | Sequence[int]


class Engine:
    def __init__(self, model: torch.nn.Module, tokenizer: Any = None,
                 cache_config: CacheConfig | None = None, backend: Any = None, *,
                 scheduler_config: SchedulerConfig | None = None, seed: int = 0,
                 fast_forward: bool = True) -> None:
        """`backend`: None (the `attn_backend` context / ASTRAI_BACKEND / automatic), a
        backend name, or an AttentionBackend instance. `tokenizer` is duck-typed: encode,
        stream_decoder, eos_id, stop_ids (None: token ids in, token ids out).
        `fast_forward`: run astrai Transformers through the fused inference forward
        (astrai/infer/forward.py; same math) rather than model()."""
        cfg = model.config
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.cache_config = cache_config = cache_config or CacheConfig()
        cache_config.validate(cfg.max_seq_len)
        self.scheduler_config = sched = scheduler_config or SchedulerConfig()
        sched.validate()
        self.max_context = cache_config.context_len(cfg.max_seq_len)
        p = next(model.parameters())
        self.device = p.device
        self.pool = PagePool(cache_config, n_layers=cfg.n_layers, n_kv_heads=cfg.kv_heads,
                             head_dim=cfg.hdim, max_context=self.max_context,
                             dtype=cache_config.torch_dtype(p.dtype), device=p.device)
        self.scheduler = Scheduler(self.pool, sched, self.max_context)
        self.runner = ModelRunner(model, self.pool, fast=fast_forward)
        self.sampler = Sampler(p.device, seed)
        self.vocab_size = cfg.vocab_size
        self._backend_choice = backend
        self._chains: dict[str, BackendChain] = {}
        self._eos = frozenset()
        if tokenizer is not None:
            stops = getattr(tokenizer, "stop_ids", None)
            eos = getattr(tokenizer, "eos_id", None)
            self._eos = frozenset(stops or ()) | (frozenset() if eos is None else {eos})
        self._requests: dict[str, Request] = {}
        self._sinks: dict[str, queue.SimpleQueue] = {}
        self._pending: list[RequestOutput] = []
        self._lock = threading.RLock()
        self._ids = itertools.count()
        self.on_step: Callable[[StepInfo], None] | None = None
        """Called after every step with its StepInfo (serving metrics)."""
        self._counts = {"steps": 0, "prefill": 0, "decode": 0, "generated": 0}

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_checkpoint(cls, path: str | Path, *, device: str = "auto",
                        dtype: str | torch.dtype | None = None,
                        cache_config: CacheConfig | None = None, backend: Any = None,
                        scheduler_config: SchedulerConfig | None = None,
                        seed: int = 0) -> Engine:
        """An engine over an astrai checkpoint or a HF Llama/Qwen2/Mistral directory, with
        the tokenizer stored in it (None when it has none: token ids in and out)."""
        from astrai.infer.loading import load_model, load_tokenizer

        model = load_model(path, device=device, dtype=dtype)
        return cls(model, load_tokenizer(path), cache_config, backend,
                   scheduler_config=scheduler_config, seed=seed)

    # -- requests --------------------------------------------------------------------------
    def _make_request(self, prompt: Prompt, params: SamplingParams | None,
                      request_id: str | None) -> Request:
        params = params or SamplingParams()
        params.validate()
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ConfigError("a text prompt needs a tokenizer: pass token ids or give the "
                                  "engine a tokenizer")
            ids = list(self.tokenizer.encode(prompt))
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise DataError("the prompt is empty: give at least one token")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise DataError(f"prompt token id {bad[0]} is outside the vocabulary "
                            f"[0, {self.vocab_size})")
        if params.stop and self.tokenizer is None:
            raise ConfigError("sampling stop strings need a tokenizer; use stop_token_ids")
        truncated = False
        if len(ids) >= self.max_context:
            if self.scheduler_config.prompt_overflow == "error":
                raise DataError(
                    f"the prompt has {len(ids)} tokens but the context holds "
                    f"{self.max_context} (prompt + output): shorten it, raise max_context, "
                    "or set prompt_overflow='truncate'")
            log.warning("prompt of %d tokens truncated to its last %d", len(ids),
                        self.max_context - 1)
            ids, truncated = ids[len(ids) - self.max_context + 1:], True
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._requests:
            raise ConfigError(f"request id '{rid}' is already in use")
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos
                                                       else self._eos)
        req = Request(rid, ids, params, time.perf_counter(), stop_ids)
        req.truncated = truncated
        if self.tokenizer is not None:
            req.text_state = TextStream(self.tokenizer.stream_decoder(), params.stop,
                                        params.include_stop_str_in_output)
        return req

    def _submit(self, req: Request, sink: queue.SimpleQueue | None = None) -> str:
        with self._lock:
            if req.id in self._requests:
                raise ConfigError(f"request id '{req.id}' is already in use")
            self._requests[req.id] = req
            if sink is not None:
                self._sinks[req.id] = sink
            self.scheduler.add(req)
        return req.id

    def add_request(self, prompt: Prompt, params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Queue a prompt (text or token ids); returns its request id."""
        with self._lock:
            return self._submit(self._make_request(prompt, params, request_id))

    def abort(self, request_id: str) -> bool:
        """Cancel a request, freeing its KV at once; its final output has reason "abort"."""
        with self._lock:
            req = self._requests.get(request_id)
            if req is None or not self.scheduler.abort(req):
                return False
            req.metrics.finished_time = time.perf_counter()
            text = req.text_state.finish()[0] if req.text_state is not None else ""
            out = self._output(req, [], text, None, None)
            self._pending.append(out)
            self._route(out)
            return True

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix no running request uses; returns the pages freed.
        Call it after changing the model's weights (e.g. between GRPO policy updates):
        cached K/V were computed with the old ones."""
        with self._lock:
            return self.pool.radix.clear() if self.pool.radix is not None else 0

    def has_unfinished(self) -> bool:
        with self._lock:
            return self.scheduler.has_work() or bool(self._pending)

    # -- the step --------------------------------------------------------------------------
    def backend(self) -> BackendChain | Any:
        """The attention backend the next step uses."""
        b = self._backend_choice
        if b is not None and not isinstance(b, str):
            return b
        from astrai.infer.backends.registry import requested_backend

        name = b if b is not None else requested_backend()
        key = name or "auto"
        if key not in self._chains:
            self._chains[key] = select_backend(name)
        return self._chains[key]

    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; returns the new outputs (deltas) of every request."""
        with self._lock:
            t0 = time.perf_counter()
            outs, self._pending = self._pending, []
            batch = self.scheduler.schedule()
            if batch is not None:
                logits = self.runner.run(batch, self.backend())
                reqs = batch.sampled
                res = self.sampler.sample(logits, reqs) if reqs else None
                now = time.perf_counter()
                self.scheduler.postprocess(batch, res.tokens if res else [], now)
                for b, req in enumerate(reqs):
                    outs.append(self._advance(req, res, b, now))
                self._count(batch, t0, now)
            for out in outs:
                self._route(out)
            return outs

    def _advance(self, req: Request, res: Any, b: int, now: float) -> RequestOutput:
        tok = res.tokens[b]
        p = req.params
        lp = top = None
        if res.logprobs is not None and (p.logprobs or p.top_logprobs):
            lp = res.logprobs[b]
            req.logprobs.append(lp)
            if res.top_logprobs is not None and p.top_logprobs:
                top = res.top_logprobs[b]
        text = ""
        ts = req.text_state
        if ts is not None:
            hit = None
            if not (req.finished and req.stop_reason == tok and tok in req.stop_ids):
                text, hit = ts.push(tok)  # a stop token is never detokenized
            if hit is None and req.finished:
                more, hit = ts.finish()
                text += more
            if hit is not None:
                if not req.finished:
                    self.scheduler.finish(req, "stop", hit)
                    req.metrics.finished_time = now
                req.finish_reason, req.stop_reason = "stop", hit
        return self._output(req, [tok], text, lp, top)

    def _output(self, req: Request, delta: list[int], text: str, lp: float | None,
                top: dict | None) -> RequestOutput:
        p = req.params
        return RequestOutput(
            request_id=req.id, delta_token_ids=delta, delta_text=text,
            token_ids=req.output_ids, text=req.text_state.text if req.text_state else "",
            finished=req.finished, finish_reason=req.finish_reason,
            usage=Usage(req.prompt_len, req.num_output, req.cached_tokens),
            metrics=req.metrics, stop_reason=req.stop_reason,
            delta_logprobs=([lp] if lp is not None else []) if p.logprobs else None,
            logprobs=list(req.logprobs) if p.logprobs else None,
            delta_top_logprobs=[top] if top is not None else None,
            prompt_truncated=req.truncated, index=getattr(req, "index", None),
        )

    def _route(self, out: RequestOutput) -> None:
        sink = self._sinks.pop(out.request_id, None) if out.finished else self._sinks.get(out.request_id)
        if sink is not None:
            sink.put(out)
        if out.finished:
            self._requests.pop(out.request_id, None)

    def _count(self, batch: Any, t0: float, now: float) -> None:
        c = self._counts
        c["steps"] += 1
        dec = sum(1 for ch in batch.chunks if ch.n == 1)
        pre = batch.num_tokens - dec
        c["decode"] += dec
        c["prefill"] += pre
        c["generated"] += len(batch.sampled)
        if self.on_step is not None:
            s = self.scheduler
            self.on_step(StepInfo(t0, now - t0, len(batch.chunks), batch.num_tokens, pre, dec,
                                  len(s.running), len(s.waiting)))

    def stats(self) -> EngineStats:
        with self._lock:
            c, s = self._counts, self.scheduler
            b = self._backend_choice
            name = b if isinstance(b, str) else getattr(b, "name", None) or "auto"
            return EngineStats(len(s.running), len(s.waiting), c["steps"], c["prefill"],
                               c["decode"], c["generated"], s.num_preemptions, s.peak_running,
                               name, self.pool.stats())

    # -- generate --------------------------------------------------------------------------
    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 stream: bool = False) -> list[RequestOutput] | Iterator[RequestOutput]:
        """Generate for one prompt or a list. stream=False: the final outputs, in prompt
        order. stream=True: an iterator of deltas (each with `index` = prompt position) as
        they are produced; closing it early aborts what is unfinished."""
        if isinstance(prompts, torch.Tensor):
            prompts = prompts.tolist()
        if isinstance(prompts, str) or (len(prompts) and isinstance(prompts[0], Integral)):
            prompts = [prompts]
        if params is None or isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ConfigError(f"{len(params)} sampling params for {len(prompts)} prompts")
        sink: queue.SimpleQueue = queue.SimpleQueue()
        with self._lock:
            reqs = [self._make_request(p, sp, None) for p, sp in zip(prompts, params)]
            for i, r in enumerate(reqs):
                r.index = i
                self._submit(r, sink)
        it = self._drain([r.id for r in reqs], sink)
        if stream:
            return it
        final = {o.request_id: o for o in it if o.finished}
        return [final[r.id] for r in reqs]

    def _drain(self, rids: list[str], sink: queue.SimpleQueue) -> Iterator[RequestOutput]:
        remaining = set(rids)
        try:
            while remaining:
                try:
                    out = sink.get_nowait()
                except queue.Empty:
                    with self._lock:
                        if sink.empty():
                            if not self.has_unfinished():
                                raise RuntimeError(f"requests {sorted(remaining)} were lost")
                            self.step()
                    continue
                if out.finished:
                    remaining.discard(out.request_id)
                yield out
        finally:
            for rid in remaining:
                self.abort(rid)
