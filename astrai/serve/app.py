"""The FastAPI application: OpenAI-compatible routes over one EngineLoop.

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
GET /metrics. Every error is OpenAI's error object with the status the OpenAI API and vLLM
use; bad input never reaches the engine, so it cannot disturb other requests. A client
that disconnects has its engine requests aborted at once (their KV pages freed).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from astrai.errors import AstraiError
from astrai.serve.errors import APIError, bad_request
from astrai.serve.loop import EngineLoop, QueueFull
from astrai.serve.metrics import ServerMetrics
from astrai.serve.protocol import Job, parse
from astrai.serve.responses import ResponseBuilder, sse

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
    max_body_bytes: int = 4 * 1024 * 1024
    created: int = 0


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


ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")


def create_app(state: ServerState) -> Any:
    app = FastAPI(title="astrai serve", docs_url=None, redoc_url=None, openapi_url=None)

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

    def auth(request: Request) -> None:
        key = state.api_key
        if key is None:
            return
        got = request.headers.get("authorization", "")
        scheme, _, token = got.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip(), key):
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                           type="authentication_error", code="invalid_api_key")

    async def body_of(request: Request) -> Any:
        raw = await request.body()
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise bad_request(f"the body is not valid JSON: {e}") from None

    def check_model(job: Job) -> None:
        if job.model is not None and job.model != state.model_name:
            raise APIError(404, f"the model '{job.model}' does not exist; this server serves "
                           f"'{state.model_name}'", type="not_found_error", param="model",
                           code="model_not_found")

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

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        auth(request)
        return {"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": state.created,
            "owned_by": "astrai", "max_model_len": state.max_context}]}

    async def generate(request: Request, kind: str) -> Response:
        auth(request)
        body = await body_of(request)
        try:
            job = parse(kind, body, tokenizer=state.tokenizer, vocab_size=state.vocab_size,
                        max_context=state.max_context)
        except AstraiError as e:  # e.g. a chat template that rejects the conversation
            raise bad_request(str(e)) from None
        check_model(job)
        return await run_job(request, job)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await generate(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, "completion")

    async def run_job(request: Request, job: Job) -> Response:
        rid = f"{'chatcmpl' if job.kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        n = job.n
        items = [(f"{rid}-{i}", job.prompts[i // n], p) for i, p in enumerate(job.params)]
        index = {item[0]: i for i, item in enumerate(items)}
        if state.loop.post is None:  # deliveries run on this (the server's) event loop
            state.loop.post = asyncio.get_running_loop().call_soon_threadsafe
        q: asyncio.Queue = asyncio.Queue()
        try:
            state.loop.submit(items, q.put_nowait)
        except QueueFull:
            raise APIError(503, "the server is at capacity (max-running + max-queue requests "
                           "in flight); retry later", type="service_unavailable",
                           code="queue_full", headers={"Retry-After": "1"}) from None
        builder = ResponseBuilder(job, rid, state.model_name, state.tokenizer)
        pending = set(index)

        async def next_output() -> Any:
            out = await q.get()
            if isinstance(out, BaseException):
                if isinstance(out, AstraiError):
                    raise bad_request(str(out))
                raise out
            if out.finished:
                pending.discard(out.request_id)
            return out

        def abandon() -> None:
            if pending:
                state.loop.abort(sorted(pending))

        if job.stream:
            first = await _first_or_disconnect(request, next_output, abandon)
            return StreamingResponse(_events(builder, index, first, next_output, pending,
                                             abandon, job.include_usage),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})

        async def collect() -> dict:
            while pending:
                out = await next_output()
                builder.add(index[out.request_id], out)
            return builder.final()

        return JSONResponse(await _or_disconnect(request, collect(), abandon))

    state.created = int(time.time())
    return AccessLog(app, state)


async def _wait_disconnect(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


async def _or_disconnect(request: Request, work: Any, abandon: Any) -> Any:
    """Await `work`; if the client goes away first, abort its requests and give up."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        abandon()
        raise asyncio.CancelledError
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            abandon()


async def _first_or_disconnect(request: Request, next_output: Any, abandon: Any) -> Any:
    """The first output before the stream's headers go out, so a request the engine refuses
    still gets its 4xx instead of a broken stream."""
    return await _or_disconnect(request, next_output(), abandon)


async def _events(builder: ResponseBuilder, index: dict[str, int], first: Any,
                  next_output: Any, pending: set[str], abandon: Any,
                  include_usage: bool) -> AsyncIterator[str]:
    try:
        out = first
        while True:
            for chunk in builder.chunks(index[out.request_id], out):
                yield sse(chunk)
            if not pending:
                break
            try:
                out = await next_output()
            except APIError as e:
                yield sse(e.body())
                return
        if include_usage:
            yield sse(builder.usage_chunk())
        yield sse("[DONE]")
    finally:  # the client went away (the task was cancelled) or the stream ended
        abandon()
