"""A step's picks applied to its requests: each advances by its new tokens, the stop rule
decides after each token whether it ends there (astrai/infer/stopping.py), and its output
delta is assembled (output.py). A request whose pick is an exception, or whose output fails
to assemble, finishes with "error" alone.
"""

from __future__ import annotations

import logging

from astrai.infer import output
from astrai.infer.request import Request, RequestOutput
from astrai.infer.sampler import Pick
from astrai.infer.scheduler import Scheduler, StepBatch
from astrai.infer.structured import ConstraintError

log = logging.getLogger("astrai.infer")


def advance(scheduler: Scheduler, batch: StepBatch, picks: list[list[Pick] | Exception],
            now: float, max_context: int) -> list[RequestOutput]:
    """Advance the step's sampled requests by their picks; their outputs."""
    reqs = batch.sampled
    outs = [fail(scheduler, req, pick, now) for req, pick in zip(reqs, picks)
            if isinstance(pick, Exception)]  # finished: the scheduler passes over them
    scheduler.postprocess(batch, [p[0].token if isinstance(p, list) else -1 for p in picks],
                          now)
    for req, got in zip(reqs, picks):
        if isinstance(got, Exception):
            continue
        try:  # the end is decided (stop token, stop string, length) before pages go
            outs.append(emit(scheduler, req, got, now, max_context))
        except Exception as e:  # noqa: BLE001 - reported in that request's output
            outs.append(fail(scheduler, req, e, now))
    return outs


def emit(scheduler: Scheduler, req: Request, picks: list[Pick], now: float,
         max_context: int) -> RequestOutput:
    """Append a request's new tokens one by one (the first is in already), deciding after
    each whether it ends there: the rest of a speculative step's tokens are dropped then,
    so output equals one-token-a-step decoding."""
    texts, kept = [], []
    for i, pick in enumerate(picks):
        if i:
            if req.finished:
                break
            scheduler.advance(req, pick.token, now)
        if req.constraint is not None:
            req.constraint.advance(pick.token)
        text, end = output.detokenize(req, pick.token, max_context)
        texts.append(text)
        kept.append(pick)
        if end is not None:
            scheduler.finish(req, end[0], now, end[1])
            break
    if len(picks) > 1:
        scheduler.trim(req)
    return output.tokens_output(req, [p.token for p in kept], "".join(texts),
                                [p.logprob for p in kept], [p.top for p in kept])


def fail(scheduler: Scheduler, req: Request, error: Exception, now: float) -> RequestOutput:
    """Finish `req` with reason "error" (also when it ended in this very step); its last
    output carries the message."""
    # a grammar failing mid-decode is the request's constraint, not a bug: one line
    log.error("request %s failed: %s: %s", req.id, type(error).__name__, error,
              exc_info=None if isinstance(error, ConstraintError) else error)
    message = f"{type(error).__name__}: {error}"
    if req.finished:
        req.finish("error", now, error=message)
    else:
        scheduler.finish(req, "error", now, error=message)
    return last_output(req)


def last_output(req: Request) -> RequestOutput:
    """The output of a request that ended without a new token (abort, error)."""
    try:
        return output.final_output(req)
    except Exception:  # noqa: BLE001 - the detokenizer itself failed: no more text
        req.text = None
        return output.final_output(req)
