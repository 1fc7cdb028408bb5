"""BenchConfig: everything `astrai serve-bench` varies, typed and validated."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from astrai.errors import ConfigError
from astrai.infer.backends.registry import BACKEND_NAMES
from astrai.infer.build import EngineOptions
from astrai.infer.config import CacheConfig, SchedulerConfig

ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
DEFAULT_INPUT_LEN = (64, 256)
DEFAULT_OUTPUT_LEN = (32, 128)
DEFAULT_PREFIX_LEN = 256


@dataclass
class BenchConfig(EngineOptions):
    """One serving benchmark: target model, workload, arrivals, engine settings (the model
    and decode options are EngineOptions'; `seed` also seeds the workload, the arrivals
    and a preset's weights)."""

    target: str
    """A preset name (random weights) or a checkpoint directory (astrai or HF)."""
    workload: str = "random"
    """random | shared-prefix | a path to a JSONL file of prompts."""
    num_prompts: int | None = None
    """Measured requests; None = 64 (random, shared-prefix) or every line of the file."""
    input_len: tuple[int, int] | None = None
    """Prompt length range (random); question length after the prefix (shared-prefix).
    None = 64-256, scaled down to fit the model's context (`fit_lengths`)."""
    output_len: tuple[int, int] | None = None
    """Output length range (lines of a JSONL file without output_len draw from it too).
    None = 32-128, scaled down to fit the model's context."""
    prefix_len: int | None = None
    """Tokens of each group's shared system prompt (shared-prefix). None = 256, scaled down
    to fit the model's context."""
    prefix_groups: int = 4
    """Groups of requests sharing one prefix (shared-prefix)."""
    request_rate: float = math.inf
    """Requests per second (Poisson / gamma arrivals); inf = all at t = 0."""
    burstiness: float = 1.0
    """Gamma shape of inter-arrival gaps: 1 = Poisson, < 1 burstier, > 1 steadier."""
    max_concurrency: int | None = None
    """Most requests in flight at once (later arrivals wait for a slot); None = no limit."""
    warmup: int = 2
    """Unmeasured short requests run first (allocations, lazy initialisation)."""
    temperature: float = 0.0
    """Sampling temperature of every request (0 = greedy, as vLLM's client sends)."""
    ignore_eos: bool = True
    """Generate exactly output_len tokens (EOS ignored), so runs compare like for like."""
    slos: dict[str, float] = field(default_factory=dict)
    """Goodput SLOs in ms: ttft / tpot / e2el."""
    backends: list[str | None] = field(default_factory=lambda: [None])
    """Attention backends to run, one table column each; None = automatic selection."""
    threads: int | None = None
    """CPU threads for torch (torch.set_num_threads) during the run; None = as is."""
    cache: CacheConfig = field(default_factory=CacheConfig)
    """The KV pool (page size, pool tokens, rows, radix sharing)."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """Continuous-batching policy (step token budget, running requests)."""
    base_url: str | None = None
    """Measure this OpenAI-compatible server (http://HOST:PORT) over streaming HTTP instead
    of an in-process engine; `target` then only provides the tokenizer (and vocabulary)."""
    endpoint: str = "/v1/completions"
    """/v1/completions (prompts sent as token ids) or /v1/chat/completions (prompts
    detokenized into one user message)."""
    model: str | None = None
    """The model id sent to the server; None = the first one /v1/models lists."""
    api_key: str | None = None
    """Sent as 'Authorization: Bearer KEY' when set."""

    def validate(self) -> None:
        if self.num_prompts is not None and self.num_prompts < 1:
            raise ConfigError(f"--num-prompts {self.num_prompts}: must be >= 1")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ConfigError(f"--max-concurrency {self.max_concurrency}: must be >= 1")
        if self.warmup < 0:
            raise ConfigError(f"--warmup {self.warmup}: must be >= 0")
        if not self.request_rate > 0:
            raise ConfigError(f"--request-rate {self.request_rate}: must be > 0 or inf")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise ConfigError(f"--burstiness {self.burstiness}: must be > 0 (1 = Poisson)")
        self.validate_engine()
        if not self.temperature >= 0:
            raise ConfigError(f"--temperature {self.temperature}: must be >= 0 (0 = greedy)")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads {self.threads}: must be >= 1")
        if not self.backends:
            raise ConfigError("no backend to run: give --backend or --compare-backends")
        for b in self.backends:
            if b is not None and b not in BACKEND_NAMES:
                raise ConfigError(f"backend '{b}': use one of {', '.join(BACKEND_NAMES)}")
        if len(set(self.backends)) != len(self.backends):
            raise ConfigError("--compare-backends names a backend twice")
        if self.loras and self.base_url is not None:
            raise ConfigError("--lora loads adapters into the in-process engine; with "
                              "--base-url, start the server with --lora and pick one with "
                              "--model")
        if self.base_url is not None:
            if not self.base_url.startswith(("http://", "https://")):
                raise ConfigError(f"--base-url {self.base_url}: use http://HOST:PORT")
            if self.endpoint not in ENDPOINTS:
                raise ConfigError(f"--endpoint {self.endpoint}: use one of "
                                  f"{', '.join(ENDPOINTS)}")


def fit_lengths(config: BenchConfig, context: int | None) -> BenchConfig:
    """The config with every length left unset (None) filled in from the defaults, scaled
    down together so that the longest request (prefix + input + output) fits `context`.

    Lengths the user set are kept as given and the unset ones share what they leave
    (`check_fits` then names any that still does not fit); `context` None (unknown) keeps
    the defaults as they are."""
    prefix_counts = config.workload == "shared-prefix"
    given = {"in": config.input_len, "out": config.output_len,
             "prefix": None if config.prefix_len is None else (config.prefix_len,) * 2}
    defaults = {"in": DEFAULT_INPUT_LEN, "out": DEFAULT_OUTPUT_LEN,
                "prefix": (DEFAULT_PREFIX_LEN,) * 2}
    counted = [k for k in given if k != "prefix" or prefix_counts]
    fixed = sum(given[k][1] for k in counted if given[k] is not None)
    free = sum(defaults[k][1] for k in counted if given[k] is None)
    scale = 1.0
    if context is not None and free:
        scale = min(1.0, max(0, context - fixed) / free)

    def fit(key: str) -> tuple[int, int]:
        if given[key] is not None:
            return given[key]
        lo, hi = defaults[key]
        return max(1, int(lo * scale)), max(1, int(hi * scale))  # floors: sums stay within

    return replace(config, input_len=fit("in"), output_len=fit("out"),
                   prefix_len=fit("prefix")[0])
