"""Engine: the streaming inference API over scheduler, KV pool, model runner and sampler.

    engine = Engine(model, tokenizer, CacheConfig(...))
    rid = engine.add_request("Hello", SamplingParams(max_tokens=32))
    while engine.has_unfinished(): outputs = engine.step()       # deltas per step
    for delta in engine.generate(prompts, params, stream=True): ...

A step reads as schedule -> run -> postprocess (nano-vllm): the scheduler picks its tokens,
the engine's one decode path (decode_path.py, chosen at construction) computes their logits,
the sampler draws (picking.py), the requests advance under the stop rule (advance.py,
stopping.py) and their outputs go to their streams (routing.py). Requests are checked
before they queue (intake.py). Failures stay with their request: an error while sampling,
assembling its output or admitting it (its LoRA adapter's slot) finishes it alone with
finish_reason "error"; a failed forward fails its step's requests (a failed schedule:
every request held), then raises to whoever ran the step.

Thread-safe: requests may be added or aborted from any thread, and several threads may
each iterate their own `generate` stream; whichever needs output drives the next step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from astrai.errors import ConfigError
from astrai.infer.advance import advance, fail, last_output
from astrai.infer.backends.registry import BackendChain, requested_backend, select_backend
from astrai.infer.cache.pool import PagePool
from astrai.infer.config import CacheConfig, SchedulerConfig, SpeculativeConfig
from astrai.infer.decode_path import choose_path
from astrai.infer.generate import generate
from astrai.infer.hugepages import place_weights
from astrai.infer.intake import Intake, Prompt
from astrai.infer.loras import MAX_LOADED_LORAS, MAX_LORA_RANK, LoraSet
from astrai.infer.metrics import EngineStats, StepCounters, StepInfo, count_step, engine_stats
from astrai.infer.params import SamplingParams
from astrai.infer.picking import pick_tokens
from astrai.infer.request import Request, RequestOutput
from astrai.infer.routing import Streams
from astrai.infer.runner import ModelRunner
from astrai.infer.sampler import Pick, Sampler
from astrai.infer.scheduler import Scheduler, StepBatch
from astrai.infer.speculative.setup import make_speculator
from astrai.infer.structured import GrammarCompiler
from astrai.kernels.cpu_linear import cpu_decode_kernels
from astrai.model.context import AttentionBackend
from astrai.model.fast_path import DecodeKernels
from astrai.model.quant4 import tile_layers

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
                 kernels: DecodeKernels | None | str = "auto", huge_pages: bool = False
                 ) -> None:
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
        ("auto": this machine's, astrai.kernels.cpu_linear, on a CPU; None: torch's); where
        they take int4 weights in tiles, the model's int4 layers are laid out so, in place
        (astrai.model.quant4: the same values, state dicts in rows as before).
        `huge_pages`: move the weights' storage into huge pages for the kernels (the same
        Parameters, new storage: off for a module the caller still trains or holds
        pointers into; `from_checkpoint` and the CLI turn it on)."""
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
        if self.cpu_kernels is not None and self.cpu_kernels.int4_tile:
            tile_layers(model)  # the layout the kernels read fastest (model/quant4.py)
        if huge_pages and self.cpu_kernels is not None:  # decode streams the weights
            place_weights(model)
        self.runner = ModelRunner(model, self.pool, self.cpu_kernels)
        self.decode_path = choose_path(self.runner, "eager" if decode == "auto" and backend
                                       is not None else decode, self.scheduler.max_running)
        """How every step runs: native | graphs | static | eager (astrai.infer.decode_path)."""
        self.sampler = Sampler(p.device, seed,
                               kernels.first_argmax if kernels is not None else None,
                               one_thread=kernels is not None)
        self.speculator = make_speculator(self, speculative, draft_model)
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

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, device: str = "auto",
                        dtype: str | torch.dtype | None = None, adapter: str | Path | None = None,
                        quantize: str | None = None, **options: Any) -> Engine:
        """An engine over an astrai checkpoint or a HF Llama/Qwen2/Mistral directory with its
        tokenizer (None without one), `adapter` merged, `quantize="int8"` weights; `options`
        are __init__'s. The commands build theirs the same way (astrai.infer.build)."""
        from astrai.infer.loading import load_model, load_tokenizer

        model = load_model(path, device=device, dtype=dtype, adapter=adapter, quantize=quantize)
        options.setdefault("huge_pages", True)  # the engine's own model
        return cls(model, load_tokenizer(path), options.pop("cache_config", None), **options)

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
        adapter = None if lora is None else self.loras.get(lora)  # unknown: refused first
        return self.intake.request(prompt, params, request_id, index=index, lora=adapter)

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
            out = last_output(req)
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
            outs = advance(self.scheduler, batch, picks, now, self.max_context)
            count_step(self, batch, outs, t0, now)
            return outs
        except Exception as e:
            self._fail_step(list({id(c.req): c.req for c in batch.chunks}.values()), e)
            raise

    def _fail_step(self, reqs: list[Request], error: Exception) -> None:
        now = time.perf_counter()
        for req in reqs:
            if req.finished and req.id not in self._requests:
                continue  # its last output is out already
            out = fail(self.scheduler, req, error, now)
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
        lora = self.loras.selection(self.loras.token_slots(batch))  # None: no adapter rows
        logits = self.decode_path.run(batch, self.backend(), lora)  # (B_s, V) fp32
        return pick_tokens(self.sampler, self.speculator, logits,
                           [c for c in batch.chunks if c.sample], masks)

    def _route(self, out: RequestOutput) -> None:
        self.streams.route(out)
        if out.finished:
            self._requests.pop(out.request_id, None)
            self.sampler.release(out.request_id)
            if self.speculator is not None:
                self.speculator.release(out.request_id)

    @property
    def grammars(self) -> GrammarCompiler:
        """Compiles structured-output constraints (cached per spec); a server compiles a
        request's constraint here first, off its event loop."""
        return self.intake.grammars

    def stats(self) -> EngineStats:
        with self.lock:
            return engine_stats(self)

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 stream: bool = False, lora: str | None | Sequence[str | None] = None
                 ) -> list[RequestOutput] | Iterator[RequestOutput]:
        """Generate for one prompt or a list. stream=False: the final outputs, in prompt
        order. stream=True: an iterator of deltas (each with `index` = prompt position) as
        they are produced; closing it early aborts what is unfinished. `lora`: an adapter
        name for every prompt, or one per prompt (None: the base)."""
        return generate(self, prompts, params, stream=stream, lora=lora)
