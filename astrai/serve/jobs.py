"""Running one validated Job on the EngineLoop: submit its choices, then answer with one
JSON response or a server-sent-event stream. A client that disconnects first has its
engine requests aborted at once (their KV pages freed).

Back-pressure: the engine produces a job's outputs whether or not its client reads them,
and a streaming client that stops reading (its socket full) would let them pile up on the
server without bound (GBs with logprobs). A job holds at most MAX_BACKLOG_STEPS steps of
outputs not yet sent (per choice); past that its engine requests are aborted, their KV
pages freed and the queued outputs dropped, and the stream ends with an error event
should the client ever read again. The queued outputs keep only what the response is
built from (the deltas), not the engine's cumulative token, text and log-probability
lists, which grow with the output.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from astrai.errors import AstraiError
from astrai.infer.request import RequestOutput
from astrai.serve.errors import APIError, bad_request
from astrai.serve.limits import queue_full
from astrai.serve.loop import EngineLoop, EngineStopped, QueueFull
from astrai.serve.protocol import Job
from astrai.serve.responses import ResponseBuilder, sse


MAX_BACKLOG_STEPS = 256
"""Engine steps of outputs (one per choice each) a job may hold unsent before its requests
are aborted: a reading client is never that far behind (a step's chunks are a few KiB)."""


def _slim(out: RequestOutput) -> RequestOutput:
    """`out` without the cumulative lists (all tokens, text, log-probabilities so far): the
    response is built from the deltas, and a queue of full copies grows quadratically."""
    return dataclasses.replace(out, token_ids=[], text="", logprobs=None)


class Outputs:
    """The engine outputs of one Job's choices, in arrival order, on the event loop; at
    most MAX_BACKLOG_STEPS x choices of them queued (module docstring)."""

    def __init__(self, loop: EngineLoop, job: Job, rid: str, lora: str | None = None) -> None:
        n = job.n
        items = [(f"{rid}-{i}", job.prompts[i // n], p) for i, p in enumerate(job.params)]
        self.index = {item[0]: i for i, item in enumerate(items)}
        self.pending = set(self.index)
        self.loop = loop
        if loop.post is None:  # deliveries run on this (the server's) event loop
            loop.post = asyncio.get_running_loop().call_soon_threadsafe
        self.q: asyncio.Queue = asyncio.Queue()
        self.backlog = MAX_BACKLOG_STEPS * len(items)
        self.fell_behind = False
        self.aborted = False
        try:
            loop.submit(items, self._deliver, lora=lora)
        except QueueFull:
            raise queue_full() from None
        except EngineStopped as e:
            raise stopped(e) from None

    def _deliver(self, out: RequestOutput | BaseException) -> None:
        if self.fell_behind:
            return
        self.q.put_nowait(_slim(out) if isinstance(out, RequestOutput) else out)
        if self.q.qsize() > self.backlog:
            self._drop()

    def _drop(self) -> None:
        """The client stopped reading: abort, free what is queued, leave one error."""
        self.fell_behind = True
        self.abandon()
        while not self.q.empty():
            self.q.get_nowait()
        self.q.put_nowait(APIError(
            503, f"the client fell more than {MAX_BACKLOG_STEPS} steps behind the stream; "
            "its requests were aborted", type="service_unavailable", code="client_too_slow"))

    async def next(self) -> Any:
        out = await self.q.get()
        if isinstance(out, APIError):
            raise out
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
        if self.pending and not self.aborted:
            self.aborted = True
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
        first = await or_disconnect(request, outs.next(), outs.abandon)
        return StreamingResponse(_events(builder, outs, first, job.include_usage),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def collect() -> dict:
        while outs.pending:
            out = await outs.next()
            builder.add(outs.index[out.request_id], out)
        return builder.final()

    return JSONResponse(await or_disconnect(request, collect(), outs.abandon))


async def _wait_disconnect(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


async def or_disconnect(request: Request, work: Any, abandon: Any) -> Any:
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
