"""The stop rule: the one place where a request's end is decided, after each new token.

In order: a stop token (the tokenizer's end of sequence, or the request's `stop_token_ids`),
a stop string completed by the text the token releases, a structured-output grammar that is
complete, `max_tokens` reached, the context full. Speculative decoding applies it to each
kept token in turn, so a request ends at the same token with or without proposals.
"""

from __future__ import annotations

from astrai.infer.request import Request

End = tuple[str, int | str | None]
"""How a request ends: (finish reason, the stop token id or stop string)."""


def stop_token(req: Request, token: int) -> End | None:
    """("stop", token) when `token` is one of the request's stop tokens."""
    return ("stop", token) if token in req.stop_ids else None


def end_after(req: Request, stop_string: str | None, max_context: int) -> End | None:
    """How the request ends after its new token was added (`stop_string`: the stop string
    that token's text completed, or None), or None when it goes on."""
    if stop_string is not None:
        return "stop", stop_string
    if req.constraint is not None and req.constraint.done:  # the grammar is complete
        return "stop", None
    if req.num_output >= req.params.max_tokens or len(req.tokens) >= max_context:
        return "length", None
    return None
