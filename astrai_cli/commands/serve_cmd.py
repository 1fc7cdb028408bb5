"""`astrai serve CHECKPOINT_OR_HF_DIR`: an OpenAI-compatible HTTP server on the engine.

Parses options into a ServeConfig and calls `astrai.serve.serve`; the access log (one
line per request) and the "listening on" line go to stderr.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from astrai_cli.engine_flags import engine_flags
from astrai_cli.options import (
    Backend,
    KvCacheDtype,
    MaxContext,
    checkpoint_path,
    threads_option,
    use_threads,
    warn_dtype,
)

if TYPE_CHECKING:
    from astrai.infer.build import EngineOptions


@contextlib.contextmanager
def server_logs() -> Iterator[None]:
    """The library's INFO lines (the decode path, failed steps, kernels) on stderr while the
    server runs; the handler and levels are taken back after, so a process that runs more
    than one command (tests, notebooks) never logs into the stderr of a finished one."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    loggers = [logging.getLogger(n) for n in ("astrai.serve", "astrai.infer", "astrai.kernels")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.removeHandler(handler)
            lg.setLevel(level)


def register(app: typer.Typer) -> None:
    @app.command("serve")
    @engine_flags()
    def serve_cmd(
        checkpoint: Annotated[Path, typer.Argument(
            metavar="CHECKPOINT_OR_HF_DIR",
            help="An astrai checkpoint or HF model directory holding tokenizer.json.")],
        host: Annotated[str, typer.Option(
            "--host", help="Interface to bind (0.0.0.0: every interface).")] = "127.0.0.1",
        port: Annotated[int, typer.Option("--port", help="TCP port; 0 picks a free one.")
                        ] = 8000,
        api_key: Annotated[str | None, typer.Option(
            "--api-key", envvar="ASTRAI_API_KEY",
            help="Require 'Authorization: Bearer KEY' on /v1 routes (env ASTRAI_API_KEY).")
        ] = None,
        served_model_name: Annotated[str | None, typer.Option(
            "--served-model-name", help="Model id clients send (default: the directory "
            "name).")] = None,
        max_running: Annotated[int, typer.Option(
            "--max-running", help="Requests decoding at once (the continuous batch).")] = 64,
        max_queue: Annotated[int, typer.Option(
            "--max-queue", help="Requests waiting beyond --max-running; more get 503.")
        ] = 256,
        chat_template: Annotated[Path | None, typer.Option(
            "--chat-template", help="A Jinja chat template file replacing the tokenizer's.")
        ] = None,
        tool_call_parser: Annotated[str | None, typer.Option(
            "--tool-call-parser", help="How tool calls are read from the output: hermes, "
            "llama3_json, mistral (default: from the chat template).")] = None,
        drain_timeout: Annotated[float, typer.Option(
            "--drain-timeout", help="Seconds in-flight requests get to finish on SIGTERM / "
            "Ctrl-C.")] = 30.0,
        max_loaded_loras: Annotated[int, typer.Option(
            "--max-loaded-loras", help="The most LoRA adapters served at once, --lora ones "
            "included; a runtime load beyond it is refused until one is unloaded.")] = 32,
        enable_lora_loading: Annotated[bool, typer.Option(
            "--enable-lora-loading", help="Open POST /v1/load_lora_adapter and "
            "/v1/unload_lora_adapter (they read server paths: needs --api-key too).")
        ] = False,
        backend: Backend = None,
        max_kv_tokens: Annotated[int, typer.Option(
            "--max-kv-tokens", help="Token slots in the KV pool.")] = 32768,
        page_size: Annotated[int, typer.Option("--page-size", help="KV page size.")] = 16,
        max_context: MaxContext = None,
        kv_dtype: KvCacheDtype = "auto",
        max_step_tokens: Annotated[int, typer.Option(
            "--max-step-tokens", help="Token budget of one engine step (chunked prefill).")
        ] = 2048,
        threads: Annotated[str | None, threads_option()] = None,
        seed: Annotated[int, typer.Option(
            "--seed", help="Seed of requests that give none.")] = 0,
        ui: Annotated[bool, typer.Option(
            "--ui/--no-ui", help="Serve the chat page at / (--no-ui: / is a 404).")] = True,
        reasoning_parser: Annotated[str, typer.Option(
            "--reasoning-parser", metavar="auto|none|qwen3|deepseek_r1", help="Return a "
            "thinking model's <think> block as reasoning_content, apart from the answer (auto: "
            "when the chat template writes one).")] = "auto",
        response_store_max: Annotated[int, typer.Option(
            "--response-store-max", help="Stored /v1/responses responses kept at most; the "
            "oldest is evicted first.")] = 1000,
        response_store_bytes: Annotated[int, typer.Option(
            "--response-store-bytes", help="Bytes of stored responses kept at most (their "
            "JSON and conversations).")] = 64 * 1024 * 1024,
        response_store_ttl: Annotated[float, typer.Option(
            "--response-store-ttl", help="Seconds a stored response stays retrievable.")
        ] = 3600.0,
        *, engine: EngineOptions,
    ) -> None:
        """Serve a model over the OpenAI API: chat/completions (streaming), models, metrics."""
        from astrai.infer.config import CacheConfig, SchedulerConfig
        from astrai.serve import ServeConfig, serve
        from astrai.serve.auth import open_warning
        from astrai.serve.responses_store import ResponseStoreConfig

        if api_key is None:  # click reads an empty variable as unset: refuse it instead
            api_key = os.environ.get("ASTRAI_API_KEY")
        checkpoint = checkpoint_path(checkpoint)  # a run directory: its newest checkpoint
        config = ServeConfig(
            model_path=str(checkpoint), host=host, port=port, api_key=api_key,
            served_model_name=served_model_name, max_running=max_running,
            max_queue=max_queue, drain_timeout=drain_timeout, backend=backend,
            enable_lora_loading=enable_lora_loading,
            **engine.engine_fields(seed=seed, max_loaded_loras=max_loaded_loras),
            chat_template=None if chat_template is None else str(chat_template),
            tool_call_parser=tool_call_parser,
            cache=CacheConfig.from_dict(dict(page_size=page_size, max_kv_tokens=max_kv_tokens,
                                             max_context=max_context,
                                             dtype=kv_dtype)),
            scheduler=SchedulerConfig.from_dict(dict(max_step_tokens=max_step_tokens)),
            ui=ui, reasoning_parser=reasoning_parser, response_store=ResponseStoreConfig(response_store_max, response_store_bytes,
                                                      response_store_ttl))
        config.validate()  # bad flags fail before the weights load
        warn_dtype(engine.device, engine.dtype)
        warning = open_warning(host, config.api_key)
        if warning is not None:
            print(f"astrai serve: warning: {warning}", file=sys.stderr, flush=True)
        if enable_lora_loading and config.api_key is None:
            print("astrai serve: warning: --enable-lora-loading without --api-key: the "
                  "load/unload routes answer 403 until the server has a key", file=sys.stderr,
                  flush=True)
        if threads is not None:
            use_threads(threads)
        def ready(url: str) -> None:
            name = config.served_model_name or checkpoint.resolve().name
            print(f"astrai serve: listening on {url} (model '{name}')", file=sys.stderr,
                  flush=True)
            if config.ui:
                print(f"astrai serve: chat page at {url}/", file=sys.stderr, flush=True)

        with server_logs():
            serve(config, on_ready=ready)
