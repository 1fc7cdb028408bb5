"""`serve(config)`: load a checkpoint into an Engine and serve it over HTTP with uvicorn.

    server = Server.from_config(ServeConfig("runs/x/checkpoints/step_100", port=0))
    server.start()            # in a thread (tests, notebooks); server.url once started
    ...; server.stop()
    serve(config, on_ready=print)   # in the foreground until SIGTERM / Ctrl-C

SIGTERM or Ctrl-C stops accepting connections, lets in-flight requests finish for up to
`drain_timeout` seconds (uvicorn's graceful shutdown), aborts what remains and returns.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from astrai.errors import CheckpointError, ConfigError
from astrai.model.gguf_file import is_gguf
from astrai.serve.address import check_listen
from astrai.serve.app import ServerState, create_app
from astrai.serve.config import ServeConfig
from astrai.serve.limits import max_prompt_chars
from astrai.serve.loop import EngineLoop
from astrai.serve.metrics import ServerMetrics
from astrai.serve.responses_store import ResponseStore

log = logging.getLogger("astrai.serve")


def load_engine(config: ServeConfig) -> Any:
    """The Engine over config.model_path, its KV rows sized for max_running requests."""
    from astrai.infer.build import build_engine, load_weights
    from astrai.infer.loading import load_tokenizer

    path = check_paths(config)
    tok = load_tokenizer(path)
    if config.chat_template is not None:
        tpl = Path(config.chat_template)
        if tok is None:
            raise ConfigError(f"--chat-template: {path} has no tokenizer.json to apply it to")
        tok.chat_template = tpl.read_text(encoding="utf-8")
    check_template(tok, f"--chat-template {config.chat_template}"
                   if config.chat_template is not None else f"{path}: the chat template")
    model = load_weights(path, config)
    cache = config.cache.model_copy(update={"max_requests": config.max_running})
    sched = config.scheduler.model_copy(update={"max_running": config.max_running})
    return build_engine(model, tok, config, cache, backend=config.backend, scheduler=sched)


def pick_reasoning(name: str, tok: Any) -> Any:
    """The reasoning parser of `--reasoning-parser`: auto = the one the chat template's
    <think> block calls for (astrai.infer.reasoning), none = none."""
    from astrai.infer.reasoning import parser_for_template, reasoning_parser

    if name == "none":
        return None
    if name == "auto":
        return parser_for_template(getattr(tok, "chat_template", None))
    return reasoning_parser(name)


def check_template(tok: Any, where: str) -> None:
    """Render a one-message conversation through the chat template before serving: a
    template that fails on it would fail every chat request, so it is refused at start-up
    in one line rather than answered with an error per request."""
    from astrai.errors import DataError
    from astrai.serve.prompts import chat_prompt_ids

    if getattr(tok, "chat_template", None) is None:
        return
    try:
        chat_prompt_ids(tok, [{"role": "user", "content": "Hello"}])
    except DataError as e:
        raise ConfigError(f"{where} fails on a one-message conversation "
                          f"({e}); fix the template or pass another") from None


def check_paths(config: ServeConfig) -> Path:
    """The model directory, once it and the chat template file are known to exist."""
    path = Path(config.model_path)
    if not path.is_dir() and not is_gguf(path):
        raise CheckpointError(f"{path}: not a checkpoint directory; point to an astrai "
                              "checkpoint, a HF model directory or a .gguf file")
    for name, lora in config.loras.items():
        if not Path(lora).is_dir():
            raise CheckpointError(f"--lora {name}={lora}: not a directory; give a PEFT LoRA "
                                  "adapter directory")
    if config.chat_template is not None and not Path(config.chat_template).is_file():
        raise ConfigError(f"--chat-template {config.chat_template}: no such file; give a "
                          "Jinja template file")
    return path


class Server:
    """An HTTP server over an Engine; `start()` in a thread or `run()` in the foreground."""

    def __init__(self, engine: Any, config: ServeConfig) -> None:
        import uvicorn

        config.validate()
        self.config = config
        self.engine = engine
        name = config.served_model_name or Path(config.model_path).resolve().name
        self.metrics = ServerMetrics(name)
        self.loop = EngineLoop(engine, max_in_flight=config.max_running + config.max_queue,
                               on_finish=self.metrics.request_finished)
        self.state = ServerState(self.loop, engine.tokenizer, name, engine.max_context,
                                 engine.vocab_size, self.metrics, config.api_key,
                                 config.max_body_bytes,
                                 tool_call_parser=config.tool_call_parser,
                                 lora_loading=config.enable_lora_loading,
                                 max_prompt_chars=max_prompt_chars(engine.tokenizer,
                                                                   engine.max_context),
                                 max_request_tokens=engine.cache_config.max_kv_tokens,
                                 responses=ResponseStore(config.response_store),
                                 reasoning=pick_reasoning(config.reasoning_parser,
                                                          engine.tokenizer))
        self.app = create_app(self.state, ui=config.ui)
        self._uv = _Uvicorn(uvicorn.Config(
            self.app, host=config.host, port=config.port, log_config=None, access_log=False,
            timeout_graceful_shutdown=config.drain_timeout, lifespan="off"))
        self._thread: threading.Thread | None = None

    @classmethod
    def from_config(cls, config: ServeConfig) -> Server:
        """Validate, check the paths and that the address is free, then load the model (the
        slow part)."""
        config.validate()
        check_paths(config)
        check_listen(config.host, config.port)
        return cls(load_engine(config), config)

    @property
    def url(self) -> str:
        """http://HOST:PORT once started (the real port when config.port is 0)."""
        return self._uv.url

    def run(self, on_ready: Callable[[str], None] | None = None) -> None:
        """Serve in this thread until SIGTERM / Ctrl-C (or stop()), then drain and return."""
        self._uv.on_ready = on_ready
        self.loop.start()
        try:
            self._uv.run()
        finally:
            self.loop.stop(timeout=5.0)
        if self._uv.failed:
            raise ConfigError(f"--port {self.config.port}: could not listen on "
                              f"{self.config.host}:{self.config.port} (in use?); choose "
                              "another port, or --port 0 for a free one")

    def start(self, timeout: float = 60.0) -> Server:
        """Serve from a background thread; returns once it accepts connections."""
        ready = threading.Event()
        self._thread = threading.Thread(target=self.run, args=(lambda _: ready.set(),),
                                        name="astrai-serve", daemon=True)
        self._thread.start()
        while not ready.wait(0.05):
            if not self._thread.is_alive():
                raise ConfigError(f"the server did not start on {self.config.host}:"
                                  f"{self.config.port} (port in use?)")
            timeout -= 0.05
            if timeout <= 0:
                raise TimeoutError("the server did not start in time")
        return self

    def stop(self) -> None:
        self._uv.should_exit = True
        if self._thread is not None:
            self._thread.join(self.config.drain_timeout + 10)


class _Uvicorn:
    """uvicorn.Server that reports its bound address when it starts listening."""

    def __init__(self, config: Any) -> None:
        import uvicorn

        outer = self

        class _S(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                # uvicorn re-raises a captured SIGTERM after draining (exit status -15);
                # `astrai serve` drains and exits 0, so the signal is not recorded.
                if self.should_exit and sig == signal.SIGINT:
                    self.force_exit = True
                else:
                    self.should_exit = True

            async def startup(self, sockets: Any = None) -> None:
                try:
                    await super().startup(sockets)
                except SystemExit:  # uvicorn exits (status 3) when the bind fails
                    self.should_exit = True
                if self.should_exit:  # bind failed
                    outer.failed = True
                    return
                host, port = self.servers[0].sockets[0].getsockname()[:2]
                outer.url = f"http://{host}:{port}"
                if outer.on_ready is not None:
                    outer.on_ready(outer.url)

        self.server = _S(config)
        self.url = ""
        self.failed = False
        self.on_ready: Callable[[str], None] | None = None

    @property
    def should_exit(self) -> bool:
        return self.server.should_exit

    @should_exit.setter
    def should_exit(self, v: bool) -> None:
        self.server.should_exit = v

    def run(self) -> None:
        self.server.run()


def serve(config: ServeConfig, on_ready: Callable[[str], None] | None = None) -> None:
    """Load config.model_path and serve it until SIGTERM / Ctrl-C."""
    Server.from_config(config).run(on_ready)
