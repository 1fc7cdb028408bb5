"""Rolling windows: how a document longer than the context is scored token by token.

The semantics of lm-evaluation-harness's `loglikelihood_rolling` (its `utils.
get_rolling_token_windows` with context_len=1, then `make_disjoint_window`): the first
window predicts the first `max_len` tokens from a prefix token (BOS / EOT) and the tokens
before them; every later window predicts the next `max_len` tokens with as much of the
preceding text as fits as context. Every token is predicted exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

Window = tuple[list[int], list[int]]
"""(context ids, continuation ids): the continuation is scored after the context."""


def rolling_windows(tokens: Sequence[int], prefix_token: int, max_len: int) -> Iterator[Window]:
    """Disjoint windows covering `tokens`; each context + continuation is at most
    max_len + 1 tokens, of which the model reads the first max_len."""
    if max_len < 1:
        raise ValueError(f"max_len={max_len}: must be >= 1")
    tokens = list(tokens)
    if not tokens:
        return
    first = min(max_len, len(tokens))
    # [prefix] + t[:first-1] predicts t[:first]; disjoint: context = the prefix token only
    yield [prefix_token], tokens[:first]
    done = first
    while done < len(tokens):
        n = min(len(tokens) - done, max_len)
        end = done + n
        # lm-eval's window is t[end-max_len-1 : end-1] predicting t[end-n:end]; its disjoint
        # form keeps as context the tokens before the first predicted one.
        yield tokens[max(0, end - max_len - 1):end - n], tokens[end - n:end]
        done = end
