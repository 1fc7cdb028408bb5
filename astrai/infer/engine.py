"""Engine: the streaming inference API over scheduler, KV pool, model runner and sampler.

    engine = Engine(model, tokenizer, CacheConfig(...))
    rid = engine.add_request("Hello", SamplingParams(max_tokens=32))
    while engine.has_unfinished(): outputs = engine.step()       # deltas per step
    for delta in engine.generate(prompts, params, stream=True): ...

A step reads as schedule -> run -> postprocess (nano-vllm): the scheduler picks the step's
tokens, the model (its own forward, through the runner) computes them and the sampler
draws a token per finished chunk, then the requests advance and their outputs are
assembled (output.py) and routed to their streams (routing.py). Requests are built and
checked before they queue (intake.py).

Failures stay with their request: an error while sampling or assembling one request's
output, or while admitting it (putting its LoRA adapter in a slot), finishes that request
with finish_reason "error" (its output says why) while the others go on. A failed
forward pass fails the requests of its step the same way (a failed schedule: every
request the engine holds, waiting or running), then raises to whoever ran the step.

Thread-safe: requests may be added or aborted from any thread, and several threads may
each iterate their own `generate` stream; whichever needs output drives the next step.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from numbers import Integral
from pathlib import Path
from typing import Any

import torch

from astrai.errors import ConfigError
from astrai.infer import output
from astrai.infer.backends.registry import BackendChain, requested_backend, select_backend
from astrai.infer.cache.pool import PagePool
from astrai.infer.config import CacheConfig, SchedulerConfig, SpeculativeConfig
from astrai.infer.decode_step import DecodeStep
from astrai.infer.hugepages import place_weights
from astrai.infer.intake import Intake, Prompt
from astrai.infer.loras import MAX_LOADED_LORAS, MAX_LORA_RANK, LoraSet
from astrai.infer.metrics import EngineStats, StepCounters, StepInfo
from astrai.infer.native_step import NativeDecodeStep
from astrai.infer.params import SamplingParams
from astrai.infer.request import Request, RequestOutput
from astrai.infer.routing import Streams, drain
from astrai.infer.runner import ModelRunner
from astrai.infer.sampler import Pick, Sampler
from astrai.infer.scheduler import Chunk, Scheduler, StepBatch
from astrai.infer.speculative.speculator import Speculator
from astrai.infer.structured import ConstraintError, GrammarCompiler
from astrai.kernels.cpu_linear import cpu_decode_kernels
from astrai.model.fast_path import DecodeKernels
from astrai.model.context import AttentionBackend

log = logging.getLogger("astrai.infer")


class Engine:
    def __init__(self, model: torch.nn.Module, tokenizer: Any = None,
                 cache_config: CacheConfig | None = None,
                 backend: str | AttentionBackend | None = None, *,
                 scheduler_config: SchedulerConfig | None = None, seed: int = 0,
                 decode: str = "auto", speculative: SpeculativeConfig | None = None,
                 draft_model: torch.nn.Module | None = None,
                 loras: dict[str, str | Path] | None = None,
                 max_loras: int | None = None, max_lora_rank: int = MAX_LORA_RANK,
                 max_loaded_loras: int = MAX_LOADED_LORAS,
                 kernels: DecodeKernels | None | str = "auto") -> None:
        """`backend`: None (the `attn_backend` context / ASTRAI_BACKEND / automatic), a
        backend name, or an AttentionBackend instance. `tokenizer` is duck-typed: encode,
        stream_decoder, eos_id, stop_ids (None: token ids in, token ids out). `decode`: how
        pure decode steps run (astrai.infer.decode_step: auto | graphs | static | eager;
        auto = CUDA graphs where the decode kernel serves the model, else eager; a backend
        given by the caller keeps auto on the eager path it chose). `speculative`:
        speculative decoding (docs/engine.md), its draft model `draft_model` or loaded from
        `speculative.model`. `loras`: name -> PEFT LoRA directory, adapters served beside
        the base in the same batches (requests pick one with `lora=`); `max_loras`:
        adapters resident in one batch (default: as many as `loras` names, at least 1);
        `max_lora_rank`, `max_loaded_loras`: the largest rank and the most adapters served
        (astrai.infer.loras). `kernels`: the CPU decode kernels of the engine's steps
        ("auto": this machine's, astrai.kernels.cpu_linear, on a CPU; None: torch's)."""
        cfg = model.config
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.cache_config = cache_config = cache_config or CacheConfig()
        cache_config.check(cfg.max_seq_len)
        self.scheduler_config = sched = scheduler_config or SchedulerConfig()
        self.max_context = cache_config.context_len(cfg.max_seq_len)
        self.vocab_size = cfg.vocab_size
        p = next(model.parameters())
        self.device = p.device
        self.pool = PagePool(cache_config, n_layers=cfg.n_layers, n_kv_heads=cfg.kv_heads,
                             head_dim=cfg.hdim, max_context=self.max_context,
                             dtype=cache_config.torch_dtype(p.dtype), device=p.device)
        self.loras = LoraSet(model, max_loras or max(1, len(loras or {})),
                             max_rank=max_lora_rank, max_loaded=max_loaded_loras)
        """The LoRA adapters served beside the base (astrai.infer.loras)."""
        for name, path in (loras or {}).items():
            self.loras.add(name, path)
        self.scheduler = Scheduler(self.pool, sched, self.max_context, self.loras)
        if kernels == "auto":
            kernels = cpu_decode_kernels() if p.device.type == "cpu" else None
        self.cpu_kernels = kernels
        """astrai's CPU decode GEMVs for the steps' few-row products (None: torch's)."""
        if self.cpu_kernels is not None:  # decode streams the weights: huge pages
            place_weights(model)
        self.runner = ModelRunner(model, self.pool, self.cpu_kernels)
        if decode == "auto" and backend is not None:
            decode = "eager"
        self.decode_step = DecodeStep(model, self.pool, self.runner.lm_head, decode,
                                      self.scheduler.max_running, self.cpu_kernels)
        self.native_step = NativeDecodeStep.create(model, self.pool, self.runner.head_operands,
                                                   self.cpu_kernels, decode)
        """Decode and verify steps as one native call on a CPU (None: not here)."""
        self.sampler = Sampler(p.device, seed)
        self.speculator = self._speculator(speculative, draft_model, p)
        self.intake = Intake(tokenizer, cfg.vocab_size, self.max_context, sched.prompt_overflow)
        self.streams = Streams()
        self.counters = StepCounters()
        self.lock = threading.RLock()
        """Held by every public call; hold it to make several calls one atomic unit."""
        self.on_step: Callable[[StepInfo], None] | None = None
        """Called after every step with its StepInfo (serving metrics)."""
        self._backend_choice = backend
        self._chains: dict[str, BackendChain] = {}
        self._requests: dict[str, Request] = {}
        self._pending: list[RequestOutput] = []

    def _speculator(self, config: SpeculativeConfig | None, draft: torch.nn.Module | None,
                    p: torch.Tensor) -> Speculator | None:
        if config is None:
            if draft is not None:
                raise ConfigError("a draft model without speculative=SpeculativeConfig("
                                  "method='draft')")
            return None
        proposer = None
        if config.method == "draft":
            from astrai.infer.loading import load_model
            from astrai.infer.speculative.draft import DraftProposer

            if draft is None and config.model is None:
                raise ConfigError("speculative method 'draft' needs a draft model: "
                                  "--speculative-model DIR")
            if draft is None:
                self._check_draft_tokenizer(config.model)
                draft = load_model(config.model, device=str(p.device), dtype=p.dtype)
            proposer = DraftProposer(draft, self.cache_config, vocab_size=self.vocab_size,
                                     max_context=self.max_context, dtype=p.dtype,
                                     device=p.device, kernels=self.cpu_kernels,
                                     native=self.native_step is not None)
        return Speculator(config, self.sampler, self.max_context,
                          self.scheduler_config.max_step_tokens, proposer)

    def _check_draft_tokenizer(self, path: str) -> None:
        """A draft must read the target's token ids: equal vocabulary sizes are not enough
        (two tokenizers of one size map text to different ids, and every proposal would
        be rejected). Compared by fingerprint when both directories have a tokenizer."""
        from astrai.infer.loading import load_tokenizer

        ours = getattr(self.tokenizer, "fingerprint", None)
        theirs = load_tokenizer(path)
        if ours is None or theirs is None or theirs.fingerprint() == ours():
            return
        where = getattr(self.tokenizer, "path", None) or "the model"
        raise ConfigError(f"--speculative-model {path}: its tokenizer differs from {where}'s "
                          "(same vocabulary size, other tokens or merges); use a draft "
                          "trained with the model's tokenizer")

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, device: str = "auto",
                        dtype: str | torch.dtype | None = None,
                        cache_config: CacheConfig | None = None,
                        backend: str | AttentionBackend | None = None,
                        scheduler_config: SchedulerConfig | None = None,
                        seed: int = 0, adapter: str | Path | None = None,
                        quantize: str | None = None, decode: str = "auto",
                        speculative: SpeculativeConfig | None = None,
                        loras: dict[str, str | Path] | None = None,
                        max_loras: int | None = None, max_lora_rank: int = MAX_LORA_RANK,
                        max_loaded_loras: int = MAX_LOADED_LORAS) -> Engine:
        """An engine over an astrai checkpoint or a HF Llama/Qwen2/Mistral directory, with
        the tokenizer stored in it (None when it has none: token ids in and out), and a
        LoRA adapter merged in (`adapter`, or a LoRA checkpoint's own), and with
        `quantize='int8'` int8 weights (`astrai.model.quant`, docs/engine.md), speculative
        decoding (`speculative`; a draft model is loaded from its `model`) and `loras`
        served unmerged beside it (see __init__)."""
        from astrai.infer.loading import load_model, load_tokenizer

        model = load_model(path, device=device, dtype=dtype, adapter=adapter,
                           quantize=quantize)
        return cls(model, load_tokenizer(path), cache_config, backend,
                   scheduler_config=scheduler_config, seed=seed, decode=decode,
                   speculative=speculative, loras=loras, max_loras=max_loras,
                   max_lora_rank=max_lora_rank, max_loaded_loras=max_loaded_loras)

    # -- requests --------------------------------------------------------------------------
    def add_request(self, prompt: Prompt, params: SamplingParams | None = None,
                    request_id: str | None = None, *, lora: str | None = None) -> str:
        """Queue a prompt (text or token ids), under the LoRA adapter named `lora` (None:
        the base); returns its request id."""
        with self.lock:
            return self._submit(self._request(prompt, params, request_id, lora=lora))

    def _request(self, prompt: Prompt, params: SamplingParams | None,
                 request_id: str | None = None, index: int | None = None,
                 lora: str | None = None) -> Request:
        adapter = None if lora is None else self.loras.get(lora)
        req = self.intake.request(prompt, params, request_id, index=index)
        req.lora = adapter
        return req

    # -- LoRA adapters ---------------------------------------------------------------------
    def add_lora(self, name: str, path: str | Path) -> None:
        """Serve the PEFT LoRA directory `path` as `name` beside the base (unmerged). The
        files are read before the engine's lock is taken: running steps go on meanwhile."""
        adapter = self.loras.read(name, path)
        with self.lock:
            self.loras.register(adapter)

    def remove_lora(self, name: str) -> None:
        """Stop serving `name`; requests already queued under it finish with it."""
        with self.lock:
            self.loras.remove(name)

    def lora_names(self) -> list[str]:
        """The adapters served, read without the engine's lock (a step may hold it for a
        long prefill): the registry's snapshot, replaced whole on every change."""
        return list(self.loras.names)

    def _submit(self, req: Request) -> str:
        if req.id in self._requests:
            raise ConfigError(f"request id '{req.id}' is already in use")
        self._requests[req.id] = req
        self.scheduler.add(req)
        return req.id

    def abort(self, request_id: str) -> bool:
        """Cancel a request, freeing its KV at once; its final output has reason "abort"."""
        with self.lock:
            req, now = self._requests.get(request_id), time.perf_counter()
            if req is None or not self.scheduler.abort(req, now):
                return False
            out = self._last_output(req)
            self._pending.append(out)  # the next step returns it; its stream has it now
            self._route(out)
            return True

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix no running request uses; returns the pages freed.
        Call it after changing the model's weights (e.g. between GRPO policy updates):
        cached K/V were computed with the old ones."""
        with self.lock:
            return self.pool.radix.clear() if self.pool.radix is not None else 0

    def has_unfinished(self) -> bool:
        with self.lock:
            return self.scheduler.has_work() or bool(self._pending)

    # -- the step --------------------------------------------------------------------------
    def backend(self) -> AttentionBackend:
        """The attention backend the next step uses."""
        b = self._backend_choice
        if b is not None and not isinstance(b, str):
            return b
        name = b if b is not None else requested_backend()
        key = name or "auto"
        if key not in self._chains:
            self._chains[key] = select_backend(name)
        return self._chains[key]

    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; returns the new outputs (deltas) of every request:
        schedule -> run -> postprocess -> route."""
        with self.lock:
            t0 = time.perf_counter()
            outs, self._pending = self._pending, []
            try:
                outs += self._advance(t0)
            except Exception:
                self._pending = outs + self._pending  # the next step returns them
                raise
            for out in outs:
                self._route(out)
            return outs

    def _advance(self, t0: float) -> list[RequestOutput]:
        """Schedule, run and postprocess one batch. When that fails outside one request's
        draw or output, the requests concerned (the batch's; every request when scheduling
        itself failed) finish with "error" and the exception propagates."""
        try:
            batch = self.scheduler.schedule()
        except Exception as e:
            self._fail_step(list(self._requests.values()), e)
            raise
        finally:  # requests whose admission failed (their adapter's slot): each alone
            rejected, self.scheduler.rejected = self.scheduler.rejected, []
            for req, error in rejected:
                self._fail_step([req], error)
        if batch is None:
            return []
        try:
            picks = self._run(batch)
            now = time.perf_counter()
            outs = self._postprocess(batch, picks, now)
            self._count(batch, outs, t0, now)
            return outs
        except Exception as e:
            self._fail_step(list({id(c.req): c.req for c in batch.chunks}.values()), e)
            raise

    def _fail_step(self, reqs: list[Request], error: Exception) -> None:
        now = time.perf_counter()
        for req in reqs:
            if req.finished and req.id not in self._requests:
                continue  # its last output is out already
            out = self._fail(req, error, now)
            self._pending.append(out)
            self._route(out)

    def _run(self, batch: StepBatch) -> list[list[Pick] | Exception]:
        """Propose (speculative decoding), forward the step, then sample or verify: per
        sampling request its new tokens (one, or the proposals kept and the token after
        them), or the error that stopped it."""
        masks = self.sampler.start_masks(batch.sampled, self.vocab_size)  # beside the forward
        if self.speculator is not None:
            self.speculator.propose(batch, self.pool, self.backend(),
                                    {r.id for r in self.scheduler.running})
        slots = self.loras.token_slots(batch)  # None: no adapter in the step
        if slots is None and self.native_step and self.native_step.accepts(batch):
            logits = self.native_step.run(batch)  # every block in one call (CPU)
        elif slots is None and self.decode_step.accepts(batch):
            logits = self.decode_step.run(batch)  # static shapes (CUDA graphs on CUDA)
        else:  # adapters' rows: the eager ragged step, each token's update gathered
            logits = self.runner.run(batch, self.backend(),
                                     self.loras.selection(slots))  # (B_s, V) fp32
        chunks = [c for c in batch.chunks if c.sample]
        if not any(c.draft for c in chunks):
            picks = self._sample(logits, batch.sampled, masks)
            return [[p] if isinstance(p, Pick) else p for p in picks]
        return self._verify(logits, chunks, masks)

    def _verify(self, logits: torch.Tensor, chunks: list[Chunk],
                masks: Future | None) -> list[list[Pick] | Exception]:
        """A step with proposals: the plain rows sample together (with the grammar masks
        begun before the forward: constrained rows never speculate, so they are all plain),
        each speculating chunk's 1 + k rows are verified."""
        first, row = [], 0
        for c in chunks:
            first.append(row)
            row += 1 + len(c.draft)
        plain = [b for b, c in enumerate(chunks) if not c.draft]
        drawn = iter(self._sample(logits[[first[b] for b in plain]],
                                  [chunks[b].req for b in plain], masks) if plain else [])
        out: list[list[Pick] | Exception] = []
        for b, c in enumerate(chunks):
            if not c.draft:
                pick = next(drawn)
                out.append([pick] if isinstance(pick, Pick) else pick)
                continue
            try:
                rows = logits[first[b]:first[b] + 1 + len(c.draft)]
                out.append(self.speculator.verify(rows, c))
            except Exception as e:  # noqa: BLE001 - reported in that request's output
                out.append(e)
        return out

    def _sample(self, logits: torch.Tensor, reqs: list[Request],
                masks: Future | None = None) -> list[Pick | Exception]:
        if not reqs:
            return []
        try:
            return list(self.sampler.sample(logits, reqs, masks))
        except Exception:  # noqa: BLE001 - find whose draw fails: each request alone
            picks: list[Pick | Exception] = []
            for b, req in enumerate(reqs):
                try:
                    picks.extend(self.sampler.sample(logits[b:b + 1], [req]))
                except Exception as e:  # noqa: BLE001 - reported in that request's output
                    picks.append(e)
            return picks

    def _postprocess(self, batch: StepBatch, picks: list[list[Pick] | Exception],
                     now: float) -> list[RequestOutput]:
        """Advance the step's requests by their new tokens and assemble their outputs."""
        reqs = batch.sampled
        outs = [self._fail(req, pick, now) for req, pick in zip(reqs, picks)
                if isinstance(pick, Exception)]  # finished: the scheduler passes over them
        self.scheduler.postprocess(
            batch, [p[0].token if isinstance(p, list) else -1 for p in picks], now)
        for req, got in zip(reqs, picks):
            if isinstance(got, Exception):
                continue
            try:  # the end is decided (stop token, stop string, length) before pages go
                outs.append(self._emit(req, got, now))
            except Exception as e:  # noqa: BLE001 - reported in that request's output
                outs.append(self._fail(req, e, now))
        return outs

    def _emit(self, req: Request, picks: list[Pick], now: float) -> RequestOutput:
        """Append a request's new tokens one by one (the first is in already), deciding
        after each whether it ends there: the rest of a speculative step's tokens are
        dropped then, so output equals one-token-a-step decoding."""
        texts, kept = [], []
        for i, pick in enumerate(picks):
            if i:
                if req.finished:
                    break
                self.scheduler.advance(req, pick.token, now)
            if req.constraint is not None:
                req.constraint.advance(pick.token)
            text, end = output.detokenize(req, pick.token, self.max_context)
            texts.append(text)
            kept.append(pick)
            if end is not None:
                self.scheduler.finish(req, end[0], now, end[1])
                break
        if len(picks) > 1:
            self.scheduler.trim(req)
        return output.tokens_output(req, [p.token for p in kept], "".join(texts),
                                    [p.logprob for p in kept], [p.top for p in kept])

    def _fail(self, req: Request, error: Exception, now: float) -> RequestOutput:
        """Finish `req` with reason "error" (also when it ended in this very step); its
        last output carries the message."""
        # a grammar failing mid-decode is the request's constraint, not a bug: one line
        log.error("request %s failed: %s: %s", req.id, type(error).__name__, error,
                  exc_info=None if isinstance(error, ConstraintError) else error)
        message = f"{type(error).__name__}: {error}"
        if req.finished:
            req.finish("error", now, error=message)
        else:
            self.scheduler.finish(req, "error", now, error=message)
        return self._last_output(req)

    def _last_output(self, req: Request) -> RequestOutput:
        """The output of a request that ended without a new token (abort, error)."""
        try:
            return output.final_output(req)
        except Exception:  # noqa: BLE001 - the detokenizer itself failed: no more text
            req.text = None
            return output.final_output(req)

    def _route(self, out: RequestOutput) -> None:
        self.streams.route(out)
        if out.finished:
            self._requests.pop(out.request_id, None)
            self.sampler.release(out.request_id)
            if self.speculator is not None:
                self.speculator.release(out.request_id)

    def _count(self, batch: StepBatch, outs: list[RequestOutput], t0: float,
               now: float) -> None:
        dec = sum(c.num_fed for c in batch.chunks if c.n == 1)
        self.counters.count(batch.num_tokens, dec, sum(len(o.delta_token_ids) for o in outs))
        if self.on_step is not None:
            s = self.scheduler
            self.on_step(StepInfo(t0, now - t0, len(batch.chunks), batch.num_tokens,
                                  batch.num_tokens - dec, dec, len(s.running), len(s.waiting)))

    @property
    def grammars(self) -> GrammarCompiler:
        """Compiles structured-output constraints (cached per spec); a server compiles a
        request's constraint here first, off its event loop."""
        return self.intake.grammars

    def stats(self) -> EngineStats:
        with self.lock:
            c, s = self.counters, self.scheduler
            b = self._backend_choice
            name = b if isinstance(b, str) else getattr(b, "name", None) or "auto"
            return EngineStats(len(s.running), len(s.waiting), c.steps, c.prefill_tokens,
                               c.decode_tokens, c.generated_tokens, s.num_preemptions,
                               s.peak_running, name, self.pool.stats(),
                               "native" if self.native_step else self.decode_step.mode,
                               *self._spec_stats())

    def _spec_stats(self) -> tuple[str | None, int, int, int]:
        sp = self.speculator
        if sp is None:
            return None, 0, 0, 0
        return (sp.config.method, *sp.stats())

    # -- generate --------------------------------------------------------------------------
    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 stream: bool = False, lora: str | None | Sequence[str | None] = None
                 ) -> list[RequestOutput] | Iterator[RequestOutput]:
        """Generate for one prompt or a list. stream=False: the final outputs, in prompt
        order. stream=True: an iterator of deltas (each with `index` = prompt position) as
        they are produced; closing it early aborts what is unfinished. `lora`: an adapter
        name for every prompt, or one per prompt (None: the base)."""
        if isinstance(prompts, torch.Tensor):
            prompts = prompts.tolist()
        if isinstance(prompts, str) or (len(prompts) and isinstance(prompts[0], Integral)):
            prompts = [prompts]
        if params is None or isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ConfigError(f"{len(params)} sampling params for {len(prompts)} prompts")
        loras = [lora] * len(prompts) if lora is None or isinstance(lora, str) else list(lora)
        if len(loras) != len(prompts):
            raise ConfigError(f"{len(loras)} lora names for {len(prompts)} prompts")
        sink: queue.SimpleQueue = queue.SimpleQueue()
        with self.lock:  # all or none: every request is checked before any is queued
            reqs = [self._request(p, sp, index=i, lora=a)
                    for i, (p, sp, a) in enumerate(zip(prompts, params, loras))]
            for r in reqs:
                self._submit(r)
                self.streams.attach(r.id, sink)
        it = drain(self, [r.id for r in reqs], sink)
        if stream:
            return it
        final = {o.request_id: o for o in it if o.finished}
        return [final[r.id] for r in reqs]
