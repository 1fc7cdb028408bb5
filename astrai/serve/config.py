"""ServeConfig: how `astrai serve` listens, authenticates and bounds its work."""

from __future__ import annotations

from dataclasses import dataclass, field

from astrai.errors import ConfigError
from astrai.infer.build import EngineOptions
from astrai.infer.config import CacheConfig, SchedulerConfig
from astrai.infer.reasoning import reasoning_parser
from astrai.serve.auth import key_problem
from astrai.serve.responses_store import ResponseStoreConfig
from astrai.serve.tool_parsers import PARSERS


@dataclass
class ServeConfig(EngineOptions):
    """One server over one checkpoint (typed, validated; the CLI fills it from flags); the
    model and decode options are EngineOptions'."""

    model_path: str
    """An astrai checkpoint or a HF Llama / Qwen2 / Mistral directory with tokenizer.json."""
    host: str = "127.0.0.1"
    """Interface to bind; 0.0.0.0 listens on every interface."""
    port: int = 8000
    """TCP port; 0 picks a free one."""
    api_key: str | None = None
    """When set, every /v1 request needs `Authorization: Bearer KEY` (401 otherwise); any
    non-empty UTF-8 text without control characters or surrounding spaces."""
    served_model_name: str | None = None
    """The model id clients send and /v1/models lists; None = the directory's name."""
    max_running: int = 64
    """Requests decoding at once in the continuous batch (the engine's KV rows)."""
    max_queue: int = 256
    """Requests waiting beyond max_running; more get 503 with Retry-After."""
    chat_template: str | None = None
    """A Jinja chat template file replacing the tokenizer's; None = the tokenizer's own."""
    tool_call_parser: str | None = None
    """How tool calls are read from the output: hermes | llama3_json | mistral; None =
    chosen from the chat template's call syntax (docs/serve.md "Tool calling")."""
    max_body_bytes: int = 4 * 1024 * 1024
    """Largest request body accepted; larger gets 413."""
    drain_timeout: float = 30.0
    """Seconds in-flight requests may take to finish after SIGTERM / Ctrl-C."""
    enable_lora_loading: bool = False
    """Open POST /v1/load_lora_adapter and /v1/unload_lora_adapter (they read server paths:
    they also need `api_key`)."""
    backend: str | None = None
    """Attention backend: torch_native | flash | cuda; None = automatic."""
    cache: CacheConfig = field(default_factory=CacheConfig)
    """The KV pool (page size, pool tokens, radix prefix sharing, context)."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """Continuous-batching policy (step token budget)."""
    ui: bool = True
    """Serve the chat page at / (`--no-ui` turns it off: / is then a 404)."""
    reasoning_parser: str = "auto"
    """How a thinking model's thinking is told from its answer (`reasoning_content`): auto
    (from the chat template's <think> block) | none | qwen3 | deepseek_r1."""
    response_store: ResponseStoreConfig = field(default_factory=ResponseStoreConfig)
    """The bounds of /v1/responses' stored responses (count, bytes, expiry)."""

    def validate(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port {self.port}: must be in 0..65535 (0 = a free port)")
        if self.max_running < 1:
            raise ConfigError(f"--max-running {self.max_running}: must be >= 1")
        if self.max_queue < 0:
            raise ConfigError(f"--max-queue {self.max_queue}: must be >= 0")
        if self.drain_timeout < 0:
            raise ConfigError(f"--drain-timeout {self.drain_timeout}: must be >= 0")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max_body_bytes={self.max_body_bytes}: must be >= 1024")
        if self.tool_call_parser is not None and self.tool_call_parser not in PARSERS:
            raise ConfigError(f"--tool-call-parser {self.tool_call_parser}: not a parser; use "
                              f"one of {', '.join(PARSERS)}")
        self.validate_engine()
        self.response_store.validate()
        if self.reasoning_parser not in ("auto", "none"):
            reasoning_parser(self.reasoning_parser)  # a ConfigError naming the choices
        self._validate_loras()
        problem = key_problem(self.api_key)
        if problem is not None:
            raise ConfigError(problem)

    def _validate_loras(self) -> None:
        if self.served_model_name in self.loras:
            raise ConfigError(f"--lora {self.served_model_name}: the name is the base model's "
                              "(--served-model-name); choose another")
