"""Output assembly: what one step tells the caller about a request.

For each sampled token: detokenize it (holding back text that may begin a stop string),
decide whether the request ends with it (the stop rule of astrai/infer/stopping.py),
keep its log-probabilities, and build the `RequestOutput` delta. A request that ends
without a new token (abort, error) gets a last output flushing the text its detokenizer
still held.
"""

from __future__ import annotations

from astrai.infer.request import Request, RequestOutput, Usage
from astrai.infer.stopping import End, end_after, stop_token


def detokenize(req: Request, token: int, max_context: int) -> tuple[str, End | None]:
    """(text the new `token` releases, how the request ends with it or None: the stop rule,
    astrai/infer/stopping.py). A stop token is never detokenized; a request that ends
    releases everything its detokenizer held (a stop string completed by that last flush
    still ends it with "stop")."""
    end = stop_token(req, token)
    if end is not None:
        text, hit = _flush(req)
        return text, end if hit is None else ("stop", hit)
    text, hit = req.text.push(token) if req.text is not None else ("", None)
    end = end_after(req, hit, max_context)
    if end is None or hit is not None:
        return text, end
    more, hit = _flush(req)
    return text + more, end if hit is None else ("stop", hit)


def _flush(req: Request) -> tuple[str, str | None]:
    return req.text.finish() if req.text is not None else ("", None)


def token_output(req: Request, token: int, text: str, logprob: float | None,
                 top: dict[int, float] | None) -> RequestOutput:
    """The delta of one new token (its text from `detokenize`, its log-probabilities from
    the sampler); the request's log-probabilities grow by it when they were asked for."""
    return tokens_output(req, [token], text, [logprob], [top])


def tokens_output(req: Request, tokens: list[int], text: str,
                  logprobs: list[float | None], tops: list[dict[int, float] | None]
                  ) -> RequestOutput:
    """The delta of a step's new tokens (several where speculative decoding kept
    proposals), with the text `detokenize` released for them."""
    p = req.params
    lps = [lp for lp in logprobs if lp is not None] if (p.logprobs or p.top_logprobs) else []
    req.logprobs.extend(lps)
    top = [t for t in tops if t is not None] if p.top_logprobs else []
    return _output(req, tokens, text, lps, top or None)


def final_output(req: Request) -> RequestOutput:
    """The last output of a request that ended without a new token (abort, error)."""
    text = req.text.finish()[0] if req.text is not None else ""
    return _output(req, [], text, [], None)


def _output(req: Request, delta: list[int], text: str, logprobs: list[float],
            top: list[dict[int, float]] | None) -> RequestOutput:
    p = req.params
    return RequestOutput(
        request_id=req.id, delta_token_ids=delta, delta_text=text,
        token_ids=req.output_ids, text=req.text.text if req.text is not None else "",
        finished=req.finished, finish_reason=req.finish_reason,
        usage=Usage(req.prompt_len, req.num_output, req.cached_tokens),
        metrics=req.metrics, stop_reason=req.stop_reason,
        delta_logprobs=logprobs if p.logprobs else None,
        logprobs=list(req.logprobs) if p.logprobs else None,
        delta_top_logprobs=top,
        prompt_truncated=req.truncated, index=req.index, error=req.error,
    )
