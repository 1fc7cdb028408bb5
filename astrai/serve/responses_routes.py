"""The Responses API routes: POST /v1/responses, GET and DELETE /v1/responses/{id}.

A request is read in a worker thread (JSON, validation, the stored conversation it
continues, the chat template, tokenizing), becomes the chat Job it asks for
(responses_request.py), runs on the engine loop with chat's back-pressure and disconnect
handling (jobs.py) and is answered as a response object or a stream of Responses events
(responses_api.py). A finished response is stored (responses_store.py) unless the request
said `store: false`; a response cut off by its client is not.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from astrai.serve.body import decode_json
from astrai.serve.errors import APIError, bad_request
from astrai.serve.jobs import Outputs, or_disconnect
from astrai.serve.lora_routes import resolve_model
from astrai.serve.protocol import Job
from astrai.serve.responses_api import (
    ResponseHead,
    ResponsesBuilder,
    as_message,
    new_id,
    sse_event,
)
from astrai.serve.responses_request import ResponsesRequest, read_request, rename
from astrai.serve.responses_store import ResponseStore

JobFrom = Callable[[Any, str, Any], Job]
"""(server state, "chat", body) -> the validated Job (app.py's job_from)."""
Compile = Callable[[Any, Job], Awaitable[None]]


@dataclass
class Prepared:
    request: ResponsesRequest
    job: Job
    conversation: list[dict]
    """The messages this response answers (without instructions): what it continued,
    then its input."""


def prepare(state: Any, raw: bytes, job_from: JobFrom) -> Prepared:
    """Body bytes -> the request, its Job and its conversation (in a worker thread)."""
    req = read_request(decode_json(raw))
    history: list[dict] = []
    if req.previous_id is not None:
        stored = state.responses.get(req.previous_id)
        if stored is None:
            raise bad_request(f"previous response with id '{req.previous_id}' not found (it "
                              "was deleted, expired, evicted or never stored)",
                              "previous_response_id", "previous_response_not_found")
        history = stored.conversation
    try:
        job = job_from(state, "chat", req.chat_body(history))
    except APIError as e:
        raise rename(e) from None
    return Prepared(req, job, history + req.messages)


def not_found(rid: str) -> APIError:
    return APIError(404, f"response with id '{rid}' not found (it was deleted, expired, "
                    "evicted or never stored)", type="not_found_error",
                    code="response_not_found")


def add_responses_routes(app: FastAPI, state: Any, auth: Callable[[Request], None],
                         job_from: JobFrom, compile: Compile) -> None:
    store: ResponseStore = state.responses

    @app.post("/v1/responses")
    async def create(request: Request) -> Response:
        auth(request)
        raw = await request.body()
        prep = await asyncio.to_thread(prepare, state, raw, job_from)
        job, req = prep.job, prep.request
        if job.constrained_by is not None:
            try:
                await compile(state, job)
            except APIError as e:
                raise rename(e) from None
        lora = resolve_model(state, job.model)
        head = ResponseHead(new_id("resp"), lora or state.model_name, req.echo,
                            req.instructions, req.previous_id, req.store)
        return await run_response(state, request, prep, ResponsesBuilder(head, job.tools, job),
                                  lora)

    @app.get("/v1/responses/{rid}")
    async def retrieve(rid: str, request: Request) -> dict:
        auth(request)
        stored = store.get(rid)
        if stored is None:
            raise not_found(rid)
        return stored.response

    @app.delete("/v1/responses/{rid}")
    async def delete(rid: str, request: Request) -> dict:
        auth(request)
        if not store.delete(rid):
            raise not_found(rid)
        return {"id": rid, "object": "response", "deleted": True}


async def run_response(state: Any, request: Request, prep: Prepared,
                       builder: ResponsesBuilder, lora: str | None) -> Response:
    outs = Outputs(state.loop, prep.job, builder.head.id, lora)

    def keep(response: dict) -> None:
        """Store a finished response (its `store` false when it does not fit)."""
        if response["store"]:
            conversation = prep.conversation + [as_message(response["output"])]
            response["store"] = state.responses.put(response["id"], response, conversation)

    if prep.job.stream:
        # the first output before the headers go out, so a request the engine refuses
        # still gets its 4xx instead of a broken stream (as chat does, jobs.py)
        first = await or_disconnect(request, outs.next(), outs.abandon)
        return StreamingResponse(_events(builder, outs, first, keep),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def collect() -> dict:
        while outs.pending:
            builder.add(await outs.next())
        return builder.final()

    response = await or_disconnect(request, collect(), outs.abandon)
    keep(response)
    return JSONResponse(response)


async def _events(builder: ResponsesBuilder, outs: Outputs, first: Any,
                  keep: Callable[[dict], None]) -> AsyncIterator[str]:
    try:
        for ev in builder.start_events():
            yield sse_event(ev)
        out = first
        while True:
            for ev in builder.events(out):
                yield sse_event(ev)
            if not outs.pending:
                break
            try:
                out = await outs.next()
            except APIError as e:  # OpenAI's stream error event
                yield sse_event(builder.event("error", code=e.code, message=e.message,
                                              param=e.param))
                return
        evs = builder.end_events()
        keep(evs[-1]["response"])
        for ev in evs:
            yield sse_event(ev)
    finally:  # the client went away (the task was cancelled) or the stream ended
        outs.abandon()
