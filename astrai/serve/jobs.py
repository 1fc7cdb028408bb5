"""Running one validated Job on the EngineLoop: submit its choices, then answer with one
JSON response or a server-sent-event stream. A client that disconnects first has its
engine requests aborted at once (their KV pages freed)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from astrai.errors import AstraiError
from astrai.serve.errors import APIError, bad_request
from astrai.serve.limits import queue_full
from astrai.serve.loop import EngineLoop, EngineStopped, QueueFull
from astrai.serve.protocol import Job
from astrai.serve.responses import ResponseBuilder, sse


class Outputs:
    """The engine outputs of one Job's choices, in arrival order, on the event loop."""

    def __init__(self, loop: EngineLoop, job: Job, rid: str, lora: str | None = None) -> None:
        n = job.n
        items = [(f"{rid}-{i}", job.prompts[i // n], p) for i, p in enumerate(job.params)]
        self.index = {item[0]: i for i, item in enumerate(items)}
        self.pending = set(self.index)
        self.loop = loop
        if loop.post is None:  # deliveries run on this (the server's) event loop
            loop.post = asyncio.get_running_loop().call_soon_threadsafe
        self.q: asyncio.Queue = asyncio.Queue()
        try:
            loop.submit(items, self.q.put_nowait, lora=lora)
        except QueueFull:
            raise queue_full() from None
        except EngineStopped as e:
            raise stopped(e) from None

    async def next(self) -> Any:
        out = await self.q.get()
        if isinstance(out, BaseException):
            if isinstance(out, AstraiError):
                raise bad_request(str(out))
            if isinstance(out, EngineStopped):
                raise stopped(out)
            raise out
        if out.finished:
            self.pending.discard(out.request_id)
        return out

    def abandon(self) -> None:
        if self.pending:
            self.loop.abort(sorted(self.pending))


def stopped(e: EngineStopped) -> APIError:
    """The 503 of a request the dead engine loop cannot serve."""
    return APIError(503, str(e), type="service_unavailable", code="engine_stopped")


async def run_job(loop: EngineLoop, request: Request, job: Job, model_name: str,
                  tokenizer: Any, lora: str | None = None) -> Response:
    """`model_name`: what the response names; `lora`: the adapter the job runs under."""
    rid = f"{'chatcmpl' if job.kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
    outs = Outputs(loop, job, rid, lora)
    builder = ResponseBuilder(job, rid, model_name, tokenizer)
    if job.stream:
        # the first output before the stream's headers go out, so a request the engine
        # refuses still gets its 4xx instead of a broken stream
        first = await _or_disconnect(request, outs.next(), outs.abandon)
        return StreamingResponse(_events(builder, outs, first, job.include_usage),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def collect() -> dict:
        while outs.pending:
            out = await outs.next()
            builder.add(outs.index[out.request_id], out)
        return builder.final()

    return JSONResponse(await _or_disconnect(request, collect(), outs.abandon))


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


async def _events(builder: ResponseBuilder, outs: Outputs, first: Any,
                  include_usage: bool) -> AsyncIterator[str]:
    try:
        out = first
        while True:
            for chunk in builder.chunks(outs.index[out.request_id], out):
                yield sse(chunk)
            if not outs.pending:
                break
            try:
                out = await outs.next()
            except APIError as e:
                yield sse(e.body())
                return
        if include_usage:
            yield sse(builder.usage_chunk())
        yield sse("[DONE]")
    finally:  # the client went away (the task was cancelled) or the stream ended
        outs.abandon()
