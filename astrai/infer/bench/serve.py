"""`serve_bench(config)`: the whole serving benchmark, one engine per attention backend.

The target is a checkpoint directory (astrai or HF, with the tokenizer stored beside it, or
none: random workloads need only token ids) or a preset. A preset gets random weights
(seeded) and a byte-level BPE tokenizer of 512 tokens trained in memory on the bundled
corpus (well under a second), so JSONL text prompts work and outputs are detokenized as
they would be in a server; its model keeps the preset's own vocabulary size, so the LM head
costs what it would. Random prompts draw ids from the ids both share, minus special tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from astrai.errors import ConfigError, DataError
from astrai.infer.bench.arrivals import arrival_offsets
from astrai.infer.bench.config import BenchConfig, fit_lengths
from astrai.infer.bench.metrics import RequestRecord, compute_metrics
from astrai.infer.bench.runner import Progress, drive, warm_up
from astrai.infer.bench.workloads import (
    BenchRequest,
    jsonl_workload,
    random_workload,
    shared_prefix_workload,
    token_pool,
    warmup_requests,
)
from astrai.infer.build import EngineOptions
from astrai.infer.params import SamplingParams
from astrai.model.gguf_file import is_gguf

DEFAULT_PROMPTS = 64
PRESET_TOKENIZER_VOCAB = 512


@dataclass
class Target:
    model: Any
    tokenizer: Any
    info: dict[str, Any]


def load_target(target: str, options: EngineOptions | None = None) -> Target:
    """A checkpoint directory, or a preset with random weights (seeded by `options.seed`)
    and a trained tiny tokenizer, loaded as `options` say."""
    from astrai.infer.build import load_weights
    from astrai.infer.loading import load_tokenizer, resolve_device, resolve_dtype
    from astrai.model.presets import PRESETS

    options = options or EngineOptions()
    path = Path(target)
    if path.is_dir() or is_gguf(path):
        model = load_weights(path, options)
        tok = load_tokenizer(path)
        info = {"kind": "checkpoint", "path": str(path),
                "tokenizer": "checkpoint" if tok is not None else None}
    elif target in PRESETS:
        from astrai.data.assets import tiny_corpus_path
        from astrai.data.bpe import train_tokenizer
        from astrai.model import build_model, get_preset

        dev = resolve_device(options.device)
        model = build_model(get_preset(target), seed=options.seed, device=dev,
                            dtype=resolve_dtype(options.dtype, dev)).eval()
        tok = train_tokenizer([tiny_corpus_path()], PRESET_TOKENIZER_VOCAB, None)
        info = {"kind": "preset", "name": target,
                "tokenizer": f"byte-level BPE {PRESET_TOKENIZER_VOCAB} (bundled corpus)"}
        if options.quantize is not None:
            from astrai.model.quant import quantize_model

            quantize_model(model, options.quantize)
    else:
        raise ConfigError(f"'{target}' is neither a checkpoint directory nor a preset: pass a "
                          f"directory or one of {', '.join(PRESETS)}")
    p = next(model.parameters())
    info.update(params=sum(t.numel() for t in model.parameters()), dtype=str(p.dtype)
                .removeprefix("torch."), device=str(p.device),
                quantize=getattr(model, "quantize", None))
    return Target(model, tok, info)


def prompt_pool(target: Target) -> np.ndarray:
    """Ids random prompts draw from: shared by model and tokenizer, minus special tokens."""
    vocab, tok = target.model.config.vocab_size, target.tokenizer
    if tok is None:
        return token_pool(vocab)
    return token_pool(min(vocab, tok.vocab_size), sorted(tok.special_ids))


def build_workload(config: BenchConfig, target: Target) -> tuple[str, list[BenchRequest]]:
    """(workload name, requests) for the config; JSONL errors name file:line. Lengths left
    unset take the defaults as they are: `fit_lengths` the config first to fit a context."""
    config = fit_lengths(config, None)
    vocab = target.model.config.vocab_size
    tok = target.tokenizer
    pool = prompt_pool(target)
    n = config.num_prompts
    if config.workload == "random":
        return "random", random_workload(n or DEFAULT_PROMPTS, config.input_len,
                                         config.output_len, pool, config.seed)
    if config.workload == "shared-prefix":
        return "shared-prefix", shared_prefix_workload(
            n or DEFAULT_PROMPTS, config.prefix_groups, config.prefix_len, config.input_len,
            config.output_len, pool, config.seed)
    encode = encode_chat = None
    if tok is not None:
        encode = tok.encode
        if tok.chat_template:
            encode_chat = tok.encode_chat
    return "jsonl", jsonl_workload(config.workload, n, config.output_len, encode=encode,
                                   encode_chat=encode_chat, vocab_size=vocab, seed=config.seed)


def check_fits(requests: list[BenchRequest], max_context: int) -> None:
    """Every request's prompt + output must fit the context (no silent truncation)."""
    for r in requests:
        if r.prompt_len + r.output_len > max_context:
            raise DataError(
                f"{r.source}: prompt {r.prompt_len} + output {r.output_len} tokens exceed the "
                f"context of {max_context}: lower --input-len / --prefix-len / --output-len "
                "(or output_len in the file)")


@dataclass
class BenchRun:
    backend: str
    metrics: dict[str, Any]
    records: list[RequestRecord] = field(repr=False, default_factory=list)


@dataclass
class BenchReport:
    model: dict[str, Any]
    workload: dict[str, Any]
    settings: dict[str, Any]
    runs: list[BenchRun]

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "workload": self.workload, "settings": self.settings,
                "runs": [{"backend": r.backend, **r.metrics} for r in self.runs]}


def bench_settings(config: BenchConfig) -> dict[str, Any]:
    rate = config.request_rate
    return {
        "request_rate": "inf" if math.isinf(rate) else rate, "burstiness": config.burstiness,
        "max_concurrency": config.max_concurrency, "seed": config.seed,
        "warmup": config.warmup, "temperature": config.temperature,
        "ignore_eos": config.ignore_eos, "slos_ms": dict(config.slos),
        "threads": torch.get_num_threads(),
        "cache": config.cache.model_dump(), "scheduler": config.scheduler.model_dump(),
        "speculative": (None if config.speculative is None
                        else config.speculative.model_dump()),
    }


def serve_bench(config: BenchConfig, progress: Any = None) -> BenchReport:
    """Load the target, build the workload and run it on each backend in turn.

    `progress(backend, done, total)` is called as measured requests finish."""
    config.validate()
    threads = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        return _serve_bench(config, progress)
    finally:
        torch.set_num_threads(threads)


def _serve_bench(config: BenchConfig, progress: Any) -> BenchReport:
    from astrai.infer.build import build_engine

    target = load_target(config.target, config)
    max_context = config.cache.context_len(target.model.config.max_seq_len)
    config = fit_lengths(config, max_context)
    name, requests = build_workload(config, target)
    check_fits(requests, max_context)
    offsets = arrival_offsets(len(requests), config.request_rate, config.burstiness,
                              config.seed)
    tok = target.tokenizer
    warm = warmup_requests(config.warmup, prompt_pool(target), config.seed)

    def params(i: int, r: BenchRequest) -> SamplingParams:
        # Per-request seeds: every backend samples the same tokens for request i.
        return SamplingParams(max_tokens=r.output_len, temperature=config.temperature,
                              ignore_eos=config.ignore_eos, seed=config.seed + i)

    runs = []
    for backend in config.backends:
        engine = build_engine(target.model, tok, config, config.cache, backend=backend,
                              scheduler=config.scheduler)
        label = backend or f"auto ({engine.backend().name})"
        warm_up(engine, warm)
        cb: Progress | None = None
        if progress is not None:
            def cb(done: int, total: int, _label: str = label) -> None:
                progress(_label, done, total)
        res = drive(engine, requests, offsets, params, max_concurrency=config.max_concurrency,
                    progress=cb, lora=lora_of(config))
        metrics = compute_metrics(res.records, res.duration, config.slos or None)
        metrics.update(res.engine)
        metrics.update(kv_pool_utilization_mean=res.kv_utilization_mean,
                       kv_pool_utilization_peak=res.kv_utilization_peak,
                       num_steps=res.num_steps, decode_path=engine.stats().decode)
        runs.append(BenchRun(label, metrics, res.records))
        del engine  # free its KV pool before the next backend allocates one
    return BenchReport(target.info, describe_workload(name, requests, config),
                       bench_settings(config), runs)


def lora_of(config: BenchConfig) -> Any:
    """Request i -> its adapter: the configured ones in turn (None: no adapters)."""
    names = list(config.loras)
    return None if not names else (lambda i: names[i % len(names)])


def describe_workload(name: str, requests: list[BenchRequest],
                      config: BenchConfig) -> dict[str, Any]:
    """The report's workload section: sizes and length ranges of what was sent."""
    lens_in = [r.prompt_len for r in requests]
    lens_out = [r.output_len for r in requests]
    workload = {"name": name, "num_prompts": len(requests),
                "mean_input_len": float(np.mean(lens_in)),
                "mean_output_len": float(np.mean(lens_out)),
                "input_len": [min(lens_in), max(lens_in)],
                "output_len": [min(lens_out), max(lens_out)]}
    if name == "shared-prefix":
        workload.update(prefix_len=config.prefix_len, prefix_groups=config.prefix_groups)
    if name == "jsonl":
        workload["path"] = str(config.workload)
    if config.loras:
        workload["loras"] = list(config.loras)
    return workload
