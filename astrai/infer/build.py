"""The one engine builder: `EngineOptions` and the functions every command builds with.

    options = EngineOptions(device="cpu", quantize="int8", loras={"sql": "adapters/sql"})
    engine = open_engine("runs/x/checkpoints/step_100", options, CacheConfig(...))

`chat`, `serve`, `serve-bench`, `eval` and `Engine.from_checkpoint` build their engines here,
so an engine option is added once: a field of EngineOptions (ServeConfig and BenchConfig
inherit them), one flag in astrai_cli's engine option list, and the line below that hands it
to the Engine. The commands differ only in what is theirs: the KV pool they size
(CacheConfig), the scheduler, and the attention backend (serve-bench runs several).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from astrai.errors import ConfigError
from astrai.infer.config import CacheConfig, SchedulerConfig, SpeculativeConfig
from astrai.infer.loading import load_model, load_tokenizer, resolve_quantize
from astrai.infer.loras import MAX_LOADED_LORAS, MAX_LORA_RANK, check_name
from astrai.model.adapter import MAX_PATH_CHARS


@dataclass(kw_only=True)
class EngineOptions:
    """How a model is loaded and decoded: the options chat, serve, serve-bench and eval
    share (typed, validated by `validate_engine`; the CLI fills them from one flag list)."""

    device: str = "auto"
    """auto | cpu | cuda | cuda:N."""
    dtype: str | None = None
    """Model dtype: None or auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16 | float16."""
    adapter: str | None = None
    """A PEFT LoRA adapter directory merged into the weights; None = the checkpoint's own
    adapter/ when it is a LoRA run's checkpoint."""
    quantize: str | None = None
    """Weight format: None (as loaded) | int8 (astrai.model.quant, docs/engine.md)."""
    decode: str = "auto"
    """How pure decode steps run: auto | eager (`--enforce-eager`); astrai.infer.decode_path."""
    speculative: SpeculativeConfig | None = None
    """Speculative decoding (`--speculative ngram`, `--speculative-model DIR`); None = off."""
    loras: dict[str, str] = field(default_factory=dict)
    """LoRA adapters served beside the base, unmerged (`--lora NAME=DIR`)."""
    max_loras: int | None = None
    """Adapters resident in one batch; None = as many as `loras`, at least 1."""
    max_lora_rank: int = MAX_LORA_RANK
    """The largest adapter rank served (`--max-lora-rank`, as vLLM's)."""
    max_loaded_loras: int = MAX_LOADED_LORAS
    """The most adapters served at once, `loras` included (`--max-loaded-loras`)."""
    seed: int = 0
    """Seed of the engine's sampler: requests that give no seed of their own."""

    def __post_init__(self) -> None:
        if self.dtype == "auto":
            self.dtype = None
        if self.quantize == "none":
            self.quantize = None

    def engine_fields(self, **changes: Any) -> dict[str, Any]:
        """These options as keyword arguments, with `changes` (to build a ServeConfig or
        BenchConfig, which inherit them)."""
        return {f.name: getattr(self, f.name) for f in fields(EngineOptions)} | changes

    def validate_engine(self) -> None:
        """One-line ConfigErrors naming the flag, before any weights load."""
        resolve_quantize(self.quantize)
        for flag, value in (("--max-loras", self.max_loras),
                            ("--max-lora-rank", self.max_lora_rank),
                            ("--max-loaded-loras", self.max_loaded_loras)):
            if value is not None and value < 1:
                raise ConfigError(f"{flag} {value}: must be >= 1")
        if len(self.loras) > self.max_loaded_loras:
            raise ConfigError(f"--lora: {len(self.loras)} adapters given, more than "
                              f"--max-loaded-loras {self.max_loaded_loras}; raise it")
        for name, path in self.loras.items():
            try:
                check_name(name)
            except ConfigError as e:
                raise ConfigError(f"--lora: {e}") from None
            if len(path) > MAX_PATH_CHARS:
                raise ConfigError(f"--lora {name}: the path has {len(path)} characters, "
                                  f"more than a file system takes ({MAX_PATH_CHARS}); give "
                                  "a PEFT LoRA adapter directory")


def load_weights(path: str | Path, options: EngineOptions) -> torch.nn.Module:
    """The eval-mode model of a checkpoint directory or a GGUF file, as `options` load it
    (astrai.infer.loading.load_model refuses anything else)."""
    return load_model(path, device=options.device, dtype=options.dtype,
                      adapter=options.adapter, quantize=options.quantize)


def build_engine(model: torch.nn.Module, tokenizer: Any, options: EngineOptions,
                 cache: CacheConfig | None = None, *, backend: Any = None,
                 scheduler: SchedulerConfig | None = None, huge_pages: bool = True,
                 draft_model: torch.nn.Module | None = None) -> Any:
    """An Engine over a loaded model. `huge_pages` (on: the engine's own model) moves the
    weights' storage into huge pages for the CPU kernels; pass False for a module the
    caller still trains or holds pointers into (astrai.infer.hugepages)."""
    from astrai.infer.engine import Engine

    return Engine(model, tokenizer, cache, backend, scheduler_config=scheduler,
                  seed=options.seed, decode=options.decode, speculative=options.speculative,
                  draft_model=draft_model, loras=options.loras, max_loras=options.max_loras,
                  max_lora_rank=options.max_lora_rank,
                  max_loaded_loras=max(options.max_loaded_loras, len(options.loras)),
                  huge_pages=huge_pages)


def open_engine(path: str | Path, options: EngineOptions, cache: CacheConfig | None = None,
                *, backend: Any = None, scheduler: SchedulerConfig | None = None) -> Any:
    """An Engine over a checkpoint directory (astrai or HF) with its tokenizer."""
    options.validate_engine()
    model = load_weights(path, options)
    return build_engine(model, load_tokenizer(path), options, cache, backend=backend, scheduler=scheduler)
