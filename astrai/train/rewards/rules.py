"""Rule rewards: answers checked against a reference, format and length rules.

Every reward has the user-reward signature `(prompts, completions, **record) -> list[float]`
(record columns: `reference` [str], `completion_ids` [[int]], ...; see rewards/base.py).

    exact          1 if the completion equals the reference (whitespace-normalised), else 0
    numeric        1 if the last number in the completion equals the numeric reference
                   (relative tolerance 1e-6), else 0
    regex:PATTERN  1 if re.search(PATTERN, completion) matches (anchor with ^...$), else 0
    length:N       -max(0, tokens - N) / N: a penalty growing past N completion tokens

An empty reference (a record without one) scores 0 under exact and numeric.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from astrai.errors import ConfigError

NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")


def normalize(text: str) -> str:
    return " ".join(text.split())


def _references(record: dict[str, Any], n: int, name: str) -> list[str]:
    refs = record.get("reference")
    if refs is None:
        raise ConfigError(f"reward '{name}' compares with reference answers, but the prompts "
                          "have none: give the records a `reference` field, or choose "
                          "another --reward")
    if len(refs) != n:
        raise ConfigError(f"reward '{name}': {len(refs)} references for {n} completions")
    return [str(r) for r in refs]


def exact_match(prompts: Sequence[str], completions: Sequence[str], **record: Any
                ) -> list[float]:
    refs = _references(record, len(completions), "exact")
    return [float(bool(r.strip()) and normalize(c) == normalize(r))
            for c, r in zip(completions, refs)]


def parse_number(text: str) -> float | None:
    """The last number written in `text` (commas as thousands separators), or None."""
    found = NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def numeric_match(prompts: Sequence[str], completions: Sequence[str], **record: Any
                  ) -> list[float]:
    refs = _references(record, len(completions), "numeric")
    out = []
    for c, r in zip(completions, refs):
        want, got = parse_number(r), parse_number(c)
        ok = want is not None and got is not None and math.isclose(
            got, want, rel_tol=1e-6, abs_tol=1e-9)
        out.append(float(ok))
    return out


def regex_reward(pattern: str) -> Callable[..., list[float]]:
    """1.0 where `pattern` is found in the completion."""
    try:
        rx = re.compile(pattern, re.DOTALL)
    except re.error as e:
        raise ConfigError(f"reward 'regex:{pattern}': invalid regular expression ({e})") from None

    def regex(prompts: Sequence[str], completions: Sequence[str], **record: Any) -> list[float]:
        return [float(rx.search(c) is not None) for c in completions]

    return regex


def length_penalty(max_tokens: str | int) -> Callable[..., list[float]]:
    """-max(0, n - N) / N with n the completion's tokens (characters when token ids are
    not given)."""
    try:
        N = int(max_tokens)
    except (TypeError, ValueError):
        N = 0
    if N <= 0:
        raise ConfigError(f"reward 'length:{max_tokens}': give a positive token count, "
                          "e.g. length:64")

    def length(prompts: Sequence[str], completions: Sequence[str], **record: Any
               ) -> list[float]:
        ids = record.get("completion_ids")
        sizes = [len(x) for x in ids] if ids is not None else [len(c) for c in completions]
        return [-max(0, n - N) / N for n in sizes]

    return length
