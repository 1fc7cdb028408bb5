"""Benchmark workloads: random, shared-prefix and JSONL prompts, as token ids.

- random: prompt lengths uniform in the input range, output lengths uniform in the output
  range, token ids uniform over the usable vocabulary (vLLM's random dataset).
- shared-prefix: G groups, each with its own random system prompt of prefix_len tokens;
  every request is its group's prefix + a random question (SGLang's
  generated-shared-prefix). Requests are shuffled so groups interleave.
- jsonl: one JSON object a line: "prompt" (text), "prompt_ids" (token ids) or "messages"
  (a chat, rendered with the tokenizer's template); optional "output_len" (alias
  "max_tokens"). Blank lines are skipped; a bad line is an error naming file:line.

All draws come from one seeded numpy generator: the same arguments give the same workload.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from astrai.data.records import load_json
from astrai.errors import ConfigError, DataError

WORKLOADS = ("random", "shared-prefix", "jsonl")


@dataclass(frozen=True)
class BenchRequest:
    prompt_ids: tuple[int, ...]
    output_len: int
    """Output tokens asked for (max_tokens; exact when EOS is ignored)."""
    source: str = ""
    """Where it came from, for error messages (e.g. 'prompts.jsonl:12')."""

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)


def parse_range(value: str | int, name: str) -> tuple[int, int]:
    """'N' or 'MIN:MAX' (inclusive) -> (lo, hi) with 1 <= lo <= hi."""
    text = str(value).strip()
    lo_s, sep, hi_s = text.partition(":")
    try:
        lo = int(lo_s)
        hi = int(hi_s) if sep else lo
    except ValueError:
        lo = hi = 0
    if not 1 <= lo <= hi:
        raise ConfigError(f"{name} '{value}': use N or MIN:MAX with 1 <= MIN <= MAX")
    return lo, hi


def token_pool(vocab_size: int, exclude: Sequence[int] = ()) -> np.ndarray:
    """Token ids prompts are drawn from: the vocabulary minus special ids."""
    bad = set(exclude)
    ids = np.array([i for i in range(vocab_size) if i not in bad], dtype=np.int64)
    if ids.size == 0:
        raise ConfigError("no usable token ids to draw random prompts from")
    return ids


def _lengths(rng: np.random.Generator, n: int, lo_hi: tuple[int, int]) -> list[int]:
    lo, hi = lo_hi
    return rng.integers(lo, hi + 1, size=n).tolist()


def random_workload(n: int, input_len: tuple[int, int], output_len: tuple[int, int],
                    pool: np.ndarray, seed: int = 0) -> list[BenchRequest]:
    rng = np.random.default_rng(seed)
    ins, outs = _lengths(rng, n, input_len), _lengths(rng, n, output_len)
    return [BenchRequest(tuple(rng.choice(pool, size=i).tolist()), o, f"random request {k}")
            for k, (i, o) in enumerate(zip(ins, outs))]


def shared_prefix_workload(n: int, groups: int, prefix_len: int, input_len: tuple[int, int],
                           output_len: tuple[int, int], pool: np.ndarray,
                           seed: int = 0) -> list[BenchRequest]:
    """n requests in `groups` groups; request k belongs to group k % groups before the
    shuffle. `input_len` is the length of the question after the shared prefix."""
    if groups < 1:
        raise ConfigError(f"--prefix-groups {groups}: must be >= 1")
    if prefix_len < 1:
        raise ConfigError(f"--prefix-len {prefix_len}: must be >= 1")
    rng = np.random.default_rng(seed)
    prefixes = [rng.choice(pool, size=prefix_len).tolist() for _ in range(groups)]
    qs, outs = _lengths(rng, n, input_len), _lengths(rng, n, output_len)
    reqs = [BenchRequest(tuple(prefixes[k % groups] + rng.choice(pool, size=q).tolist()), o,
                         f"shared-prefix request {k} (group {k % groups})")
            for k, (q, o) in enumerate(zip(qs, outs))]
    order = rng.permutation(n).tolist()
    return [reqs[i] for i in order]


def _line_request(obj: Any, where: str, encode: Callable[[str], list[int]] | None,
                  encode_chat: Callable[[list], list[int]] | None, vocab_size: int | None,
                  default_out: int) -> BenchRequest:
    def bad(why: str) -> DataError:
        return DataError(f"{where}: {why}")

    if not isinstance(obj, dict):
        raise bad("expected a JSON object like {\"prompt\": \"...\", \"output_len\": 64}")
    keys = [k for k in ("prompt", "prompt_ids", "messages") if k in obj]
    if len(keys) != 1:
        raise bad("give exactly one of 'prompt' (text), 'prompt_ids' (token ids) or "
                  "'messages' (chat)")
    key = keys[0]
    value = obj[key]
    if key == "prompt_ids":
        if not isinstance(value, list) or not all(type(t) is int for t in value):
            raise bad("'prompt_ids' must be a list of integer token ids")
        ids = list(value)
    elif key == "prompt":
        if not isinstance(value, str):
            raise bad("'prompt' must be a string")
        if encode is None:
            raise bad("a text prompt needs a tokenizer: use a checkpoint with tokenizer.json "
                      "or give 'prompt_ids'")
        ids = list(encode(value))
    else:
        if not isinstance(value, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str) for m in value):
            raise bad("'messages' must be a list of {\"role\": ..., \"content\": ...} objects")
        if encode_chat is None:
            raise bad("'messages' needs a tokenizer with a chat template")
        ids = list(encode_chat(value))
    if not ids:
        raise bad(f"'{key}' is empty")
    if vocab_size is not None:
        oob = [t for t in ids if not 0 <= t < vocab_size]
        if oob:
            raise bad(f"token id {oob[0]} is outside the model's vocabulary [0, {vocab_size})")
    out = obj.get("output_len", obj.get("max_tokens", default_out))
    if type(out) is not int or out < 1:
        raise bad(f"'output_len' must be an integer >= 1, got {out!r}")
    return BenchRequest(tuple(ids), out, where)


def jsonl_workload(path: str | Path, n: int | None, output_len: tuple[int, int], *,
                   encode: Callable[[str], list[int]] | None = None,
                   encode_chat: Callable[[list], list[int]] | None = None,
                   vocab_size: int | None = None, seed: int = 0) -> list[BenchRequest]:
    """The first n requests of a JSONL file (all when n is None). Lines without an output
    length get one drawn from `output_len`."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"workload '{path}': no such file; use random, shared-prefix or the "
                        "path of a JSONL file of prompts")
    rng = np.random.default_rng(seed)
    reqs: list[BenchRequest] = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if n is not None and len(reqs) >= n:
                break
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")  # a BOM is no text
            except UnicodeDecodeError:
                raise DataError(f"{where}: not UTF-8 text; save the file as UTF-8") from None
            if not line.strip():
                continue
            obj = load_json(line, where)
            default = int(rng.integers(output_len[0], output_len[1] + 1))
            reqs.append(_line_request(obj, where, encode, encode_chat, vocab_size, default))
    if not reqs:
        raise DataError(f"{path}: no prompts (the file is empty); write one JSON object a line")
    return reqs


def warmup_requests(n: int, pool: np.ndarray, seed: int = 0, input_len: int = 16,
                    output_len: int = 8) -> list[BenchRequest]:
    """Short random requests that warm the engine up (never measured)."""
    # A seed far from the workload's keeps their random prompts from sharing prefixes.
    return random_workload(n, (input_len, input_len), (output_len, output_len), pool,
                           seed=seed + 1_000_003)
