"""The FastAPI application: OpenAI-compatible routes over one EngineLoop.

Routes: POST /v1/chat/completions, POST /v1/completions, the Responses API (POST
/v1/responses, GET and DELETE /v1/responses/{id}; responses_routes.py), GET /v1/models,
GET /health, GET /metrics, and vLLM's POST /v1/load_lora_adapter, /v1/unload_lora_adapter
(lora_routes.py; off unless the server was started to allow them). Every error is OpenAI's error object with the status the OpenAI API and vLLM
use; bad input never reaches the engine, so it cannot disturb other requests. The work a
request body costs before the engine sees it (JSON decoding, validation, tokenization,
the chat template) runs in a worker thread, so the event loop keeps answering other
clients (/health included) while a large body is read; running it is jobs.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from astrai.errors import AstraiError
from astrai.serve.auth import authorized
from astrai.serve.body import decode_json
from astrai.serve.chat_page import add_page_routes
from astrai.serve.constraints import COMPILE_TIMEOUT, compile_constraints
from astrai.serve.errors import APIError, bad_request
from astrai.serve.jobs import run_job
from astrai.serve.limits import check_capacity
from astrai.serve.lora_routes import add_lora_routes, model_cards, resolve_model
from astrai.serve.loop import EngineLoop
from astrai.serve.metrics import ServerMetrics
from astrai.serve.protocol import Job, parse
from astrai.serve.responses_routes import add_responses_routes
from astrai.serve.responses_store import ResponseStore

access = logging.getLogger("astrai.serve.access")


@dataclass
class ServerState:
    loop: EngineLoop
    tokenizer: Any
    model_name: str
    max_context: int
    vocab_size: int
    metrics: ServerMetrics
    api_key: str | None = None
    """Compared as UTF-8 bytes with the Authorization header's bytes (auth.py)."""
    max_body_bytes: int = 4 * 1024 * 1024
    created: int = 0
    tool_call_parser: str | None = None
    """`--tool-call-parser`: how tool calls are read; None = chosen from the template."""
    lora_loading: bool = False
    """--enable-lora-loading: the runtime adapter routes are open (with an API key)."""
    max_prompt_chars: int | None = None
    """The longest completions prompt text the context could take (limits.py); None: no
    bound but the body's size."""
    max_request_tokens: int | None = None
    """The most tokens one request's choices may generate together (the KV pool's tokens);
    None: unbounded."""
    responses: ResponseStore = field(default_factory=ResponseStore)
    """The stored responses of /v1/responses (responses_store.py)."""
    reasoning: Any = None
    """The reasoning parser (`--reasoning-parser`, astrai.infer.reasoning); None: none."""


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


class AccessLog:
    """ASGI middleware: one access-log line per request (when its response ends), the
    body-size limit (413) and the HTTP response counter of /metrics."""

    def __init__(self, app: Any, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        info = {"status": 500}
        limit = self.state.max_body_bytes
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await error_response(APIError(413, f"the request body is {int(length)} bytes; the "
                                          f"limit is {limit}", code="request_too_large"))(
                scope, receive, send)
            return self._log(scope, 413, t0)
        seen = 0

        async def limited_receive() -> dict:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise APIError(413, f"the request body exceeds {limit} bytes",
                                   code="request_too_large")
            return msg

        async def logged_send(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                info["status"] = msg["status"]
            await send(msg)

        try:
            await self.app(scope, limited_receive, logged_send)
        finally:
            self._log(scope, info["status"], t0)

    def _log(self, scope: dict, status: int, t0: float) -> None:
        client = scope.get("client") or ("-", 0)
        path = scope.get("path", "")
        access.info('%s:%s "%s %s" %d %.1fms', client[0], client[1], scope.get("method"),
                    path, status, (time.perf_counter() - t0) * 1000)
        known = path if path in ROUTES else "other"
        self.state.metrics.http_response(known, status)


ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
          "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/responses")


def create_app(state: ServerState, ui: bool = True) -> Any:
    """`ui`: serve the chat page at / (chat_page.py); False: / is a 404."""
    app = FastAPI(title="astrai serve", docs_url=None, redoc_url=None, openapi_url=None)
    _error_handlers(app)
    _probe_routes(app, state)
    _api_routes(app, state)
    if ui:
        add_page_routes(app)
    state.created = int(time.time())
    return AccessLog(app, state)


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError) -> JSONResponse:
        return error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return error_response(APIError(e.status_code, str(e.detail), type=kind))

    @app.exception_handler(Exception)
    async def _internal(_: Request, e: Exception) -> JSONResponse:
        logging.getLogger("astrai.serve").exception("internal error")
        return error_response(APIError(500, f"internal error: {type(e).__name__}",
                                       type="internal_server_error"))


def _probe_routes(app: FastAPI, state: ServerState) -> None:
    """/health and /metrics: open (no key) for probes and scrapers."""
    @app.get("/health")
    async def health() -> Response:
        if not state.loop.alive():
            return error_response(APIError(503, "the engine loop has stopped",
                                           type="service_unavailable"))
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        # In-flight first: a request leaves the count only after its pages are freed, so
        # a scrape that sees 0 in flight also sees their pages free (stats taken first
        # could predate an abort that the count then already reflects).
        in_flight = state.loop.in_flight
        stats = await asyncio.to_thread(state.loop.engine.stats)
        return PlainTextResponse(state.metrics.render(stats, in_flight),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")


def _api_routes(app: FastAPI, state: ServerState) -> None:
    """The /v1 routes, each behind the API key when there is one."""
    key = None if state.api_key is None else state.api_key.encode("utf-8")

    def auth(request: Request) -> None:
        if key is not None and not authorized(request.headers.get("authorization"), key):
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                           type="authentication_error", code="invalid_api_key")

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        auth(request)
        return {"object": "list", "data": model_cards(state)}

    async def generate(request: Request, kind: str) -> Response:
        auth(request)
        raw = await request.body()
        job = await asyncio.to_thread(read_job, state, kind, raw)
        if job.constrained_by is not None:
            await _compile(state, job)
        lora = resolve_model(state, job.model)
        return await run_job(state.loop, request, job, lora or state.model_name,
                             state.tokenizer, lora=lora)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await generate(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, "completion")

    add_lora_routes(app, state, auth)
    add_responses_routes(app, state, auth, job_from, _compile)


async def _compile(state: ServerState, job: Job) -> None:
    """The job's constraints compiled in a worker thread, within COMPILE_TIMEOUT (the
    thread, bounded by llguidance's parser limits, may finish later; its grammar is then
    cached)."""
    grammars = state.loop.engine.grammars
    tools = job.tools.tools if job.tools is not None and job.tools.enforced else None
    work = asyncio.to_thread(compile_constraints, grammars,
                             [p.structured_outputs for p in job.params], job.constrained_by,
                             tools)
    try:
        await asyncio.wait_for(work, COMPILE_TIMEOUT)
    except TimeoutError:
        raise bad_request(f"the constraint did not compile within {COMPILE_TIMEOUT:g} s; "
                          "simplify the schema or grammar", job.constrained_by) from None


def read_job(state: ServerState, kind: str, raw: bytes) -> Job:
    """Body bytes -> a validated Job for this server (in a worker thread: decoding,
    tokenizing and rendering a large body never hold the event loop)."""
    return job_from(state, kind, decode_json(raw))


def job_from(state: ServerState, kind: str, body: Any) -> Job:
    """A decoded request body -> a validated Job for this server (in a worker thread)."""
    loop = state.loop

    def admit(choices: int) -> None:
        check_capacity(choices, loop.in_flight, loop.max_in_flight)

    try:
        job = parse(kind, body, tokenizer=state.tokenizer, vocab_size=state.vocab_size,
                    max_context=state.max_context, admit=admit,
                    tool_parser=state.tool_call_parser, reasoning=state.reasoning,
                    max_prompt_chars=state.max_prompt_chars,
                    max_request_tokens=state.max_request_tokens)
    except AstraiError as e:  # e.g. a chat template that rejects the conversation
        raise bad_request(str(e)) from None
    except RecursionError:
        raise bad_request("the body is nested too deeply to be a request") from None
    resolve_model(state, job.model)  # an unknown model is a 404 before any work
    return job
