"""Structured outputs: a request whose output must parse — a JSON Schema, any JSON object, a
regex, one of a list of strings, or a grammar.

The constraint becomes a grammar of llguidance (Microsoft's grammar engine, the one vLLM
and SGLang offer beside xgrammar): a Lark-like dialect with `%json` for JSON Schemas
(its docs, "Syntax of LLGuidance Grammars"). A matcher per request walks the grammar over
the tokens; before each draw it writes the bitmask of the tokens that keep the output
inside the language (the sampler sets the others to -inf), and after each draw it consumes
the token. The request ends when the grammar is complete and nothing may follow
(`Constraint.done`), or by EOS once the grammar accepts.

Compiling a grammar builds its lexer; the result is kept per constraint (LRU) and each
request gets a copy (`LLMatcher.deep_copy`), so a schema sent a thousand times compiles
once. Work per compile is bounded by llguidance's parser limits and by `MAX_SPEC_CHARS`;
the work of each token mask, which llguidance does lazily, by a probe when the constraint
compiles (grammar_cost).
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from astrai.errors import ConfigError
from astrai.infer.grammar_cost import (
    BATCH_MASK_BUDGET,
    CACHE_BYTES,
    MASK_BUDGET,
    entry_bytes,
    parser_limits,
    probe,
)

MAX_SPEC_CHARS = 64 * 1024
"""Longest schema, regex or grammar (characters): a bound on the work one request may ask
the compiler for."""
MAX_CHOICES = 1024
"""Most strings a `choice` may list."""
CACHE_SIZE = 256
"""Compiled constraints kept (least recently used dropped; also bounded by bytes,
`grammar_cost.CACHE_BYTES`)."""
JSON_STYLE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
"""How JSON is written: `json.dumps`'s layout, no free whitespace (a model cannot pad the
output with blanks until max_tokens). A schema's own "x-guidance" overrides it."""
KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredOutputs:
    """One constraint (vLLM's `StructuredOutputsParams`): exactly one field set.

    `json` is a JSON Schema (a dict, or its JSON text); `json_object` any JSON object;
    `regex` a regular expression the whole output matches (Rust `regex` syntax);
    `choice` one of these strings exactly; `grammar` a grammar in llguidance's Lark
    dialect (docs/serve.md "Structured outputs")."""

    json: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | list[str] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.json, bool):  # else `False` would read as "not set"
            what = "false rejects every output" if not self.json else "true accepts any JSON"
            raise ConfigError(f"structured outputs json: the schema must be a JSON Schema "
                              f"object, got {str(self.json).lower()} ({what})")
        set_ = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(set_) != 1:
            raise ConfigError("structured outputs: set exactly one of json, json_object, "
                              f"regex, choice, grammar (got {', '.join(set_) or 'none'})")
        if self.json is not None:
            object.__setattr__(self, "json", _schema_text(self.json))
        if self.choice is not None:
            object.__setattr__(self, "choice", _choices(self.choice))
        for k in ("regex", "grammar"):
            v = getattr(self, k)
            if v is not None and not isinstance(v, str):
                raise ConfigError(f"structured outputs {k}: must be a string")
        if len(self.source) > MAX_SPEC_CHARS:
            raise ConfigError(f"structured outputs {self.kind}: {len(self.source)} characters; "
                              f"at most {MAX_SPEC_CHARS}")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def source(self) -> str:
        """The constraint as text (the cache key, with `kind`)."""
        v = getattr(self, self.kind)
        return "" if v is True else "\n".join(v) if self.kind == "choice" else v


def _schema_text(schema: Any) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise ConfigError(f"structured outputs json: not valid JSON ({e})") from None
    if not isinstance(schema, dict | bool):
        raise ConfigError("structured outputs json: a JSON Schema is an object")
    # Not sorted: the grammar writes properties in the schema's order, as OpenAI's and
    # vLLM's structured outputs do, so two schemas that differ only in property order are
    # two constraints (and two cache entries).
    return json.dumps(schema, ensure_ascii=False)


def _choices(choice: Any) -> tuple[str, ...]:
    if (not isinstance(choice, list | tuple) or not choice
            or not all(isinstance(c, str) and c for c in choice)):
        raise ConfigError("structured outputs choice: must be a non-empty list of non-empty "
                          "strings")
    if len(choice) > MAX_CHOICES:
        raise ConfigError(f"structured outputs choice: {len(choice)} strings; at most "
                          f"{MAX_CHOICES}")
    return tuple(choice)


def grammar_text(spec: StructuredOutputs) -> str:
    """The llguidance grammar of a constraint."""
    llg = _llguidance()
    if spec.kind in ("json", "json_object"):
        schema = spec.json if spec.kind == "json" else '{"type": "object"}'
        try:
            return llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_STYLE)
        except ValueError as e:
            raise ConfigError(f"structured outputs json: {e}") from None
    if spec.kind == "regex":
        return llg.LLMatcher.grammar_from_regex(spec.regex)
    if spec.kind == "choice":
        alts = " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.choice)
        return llg.LLMatcher.grammar_from_lark(f"start: {alts}\n")
    return llg.LLMatcher.grammar_from_lark(spec.grammar)


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError:
        raise ConfigError("structured outputs need llguidance: pip install "
                          "'astrai[structured]'") from None
    return llguidance


class ConstraintError(RuntimeError):
    """A grammar failed while decoding (its request ends with "error"); the message is
    one line, without llguidance's state dump."""


def matcher_error(matcher: Any) -> str:
    """llguidance's error of a matcher as one short line: its first line (the rest is a
    multi-kilobyte dump of the parser's state)."""
    lines = (matcher.get_error() or "").strip().splitlines()
    return _first_line(lines[0]) if lines else ""


class Constraint:
    """One request's walk through its grammar."""

    def __init__(self, matcher: Any, kind: str) -> None:
        self.matcher = matcher
        self.kind = kind

    def fill(self, bitmask: Any, row: int) -> None:
        """Write the allowed next tokens into row `row` of an int32 bitmask (CPU)."""
        v = bitmask[row]
        self.matcher.unsafe_compute_mask_ptr(v.data_ptr(), v.numel() * v.element_size())

    def advance(self, token: int) -> None:
        """Consume the drawn token; a token outside the grammar is an error."""
        if not self.matcher.consume_token(token) or self.matcher.is_error():
            raise ConstraintError(f"token {token} breaks the {self.kind} constraint: "
                                  f"{matcher_error(self.matcher)}")

    @property
    def done(self) -> bool:
        """Complete, and nothing may follow (EOS aside)."""
        return self.matcher.is_stopped()


@functools.cache
def _executor() -> Any:
    """llguidance's thread pool for the masks of several rows (made on first use)."""
    return _llguidance().LLExecutor()


def fill_bitmask(constraints: list[Constraint], vocab_size: int) -> Any:
    """int32 [len(constraints), ceil(V/32)] CPU bitmask of each constraint's allowed next
    tokens, computed by llguidance's thread pool (without the GIL) when there are several."""
    import torch

    bitmask = torch.zeros(len(constraints), (vocab_size + 31) // 32, dtype=torch.int32)
    if len(constraints) == 1:
        constraints[0].fill(bitmask, 0)
        return bitmask
    _executor().unsafe_compute_mask_ptr([(c.matcher, i) for i, c in enumerate(constraints)],
                                         bitmask.data_ptr(), bitmask.shape[1] * 4,
                                         len(constraints))
    return bitmask


class GrammarCompiler:
    """Compiles constraints against one tokenizer and vocabulary; thread-safe. The
    llguidance tokenizer is built on first use (about a second for a 150k vocabulary)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._lltok: Any = None
        self._cache: OrderedDict[tuple[str, str], tuple[Any, float, int]] = OrderedDict()
        """(kind, source) -> (compiled matcher, worst mask CPU seconds, estimated bytes)."""
        self._bytes = 0
        self._lock = threading.Lock()

    def lltokenizer(self) -> Any:
        with self._lock:
            if self._lltok is None:
                if self.tokenizer is None or not hasattr(self.tokenizer, "backend"):
                    raise ConfigError("structured outputs need the model's tokenizer")
                llg = _llguidance()
                stops = sorted(set(self.tokenizer.stop_ids or ())) or None
                self._lltok = llg.LLTokenizer(self.tokenizer.backend.to_str(),
                                              n_vocab=self.vocab_size, eos_token=stops)
            return self._lltok

    def compile(self, spec: StructuredOutputs, copies: int = 1) -> Any:
        """The spec's fresh matcher (compiled once per distinct spec); raises ConfigError
        naming what the grammar engine refused (e.g. an unsupported schema keyword), or a
        mask costlier than `MASK_BUDGET` (or, for `copies` rows of it, than
        `BATCH_MASK_BUDGET`): see grammar_cost."""
        key = (spec.kind, spec.source)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                matcher, seconds = hit[0].deep_copy(), hit[1]
        if hit is None:
            matcher, seconds = self._build(spec, key)
        if copies * seconds > BATCH_MASK_BUDGET:
            raise ConfigError(f"structured outputs {spec.kind}: {copies} rows of this "
                              f"constraint take {copies * seconds:.2f} s of grammar work per "
                              f"token; at most {BATCH_MASK_BUDGET:g} s: ask for fewer choices "
                              "or simplify it")
        return matcher

    def _build(self, spec: StructuredOutputs, key: tuple[str, str]) -> tuple[Any, float]:
        """Compile, probe and cache a spec: (a fresh matcher, worst CPU seconds of a mask)."""
        tok = self.lltokenizer()
        llg = _llguidance()
        grammar = grammar_text(spec)
        limits = parser_limits(llg)
        error = llg.LLMatcher.validate_grammar(grammar, tok, limits=limits)
        if error:
            raise ConfigError(f"structured outputs {spec.kind}: {_first_line(error)}")
        matcher = llg.LLMatcher(tok, grammar, log_level=0, limits=limits)
        if matcher.is_error():
            raise ConfigError(f"structured outputs {spec.kind}: "
                              f"{_first_line(matcher.get_error())}")
        stops = frozenset(getattr(self.tokenizer, "stop_ids", None) or ())
        seen = probe(matcher, self.vocab_size, stops)
        if seen.error:
            raise ConfigError(f"structured outputs {spec.kind}: no output can satisfy it "
                              "within the grammar engine's limits (an empty language, or too "
                              f"complex: {_first_line(seen.error)}); simplify it")
        if seen.worst > MASK_BUDGET:
            raise ConfigError(f"structured outputs {spec.kind}: one token mask takes "
                              f"{seen.worst:.2f} s of grammar work; at most {MASK_BUDGET:g} "
                              "s: simplify it (e.g. smaller repetition counts)")
        if seen.empty:  # llguidance reports some grammars only when it computes a mask
            raise ConfigError(f"structured outputs {spec.kind}: no output can satisfy it")
        worst, size, fresh = seen.worst, entry_bytes(grammar, seen.first), matcher.deep_copy()
        with self._lock:
            if key not in self._cache:
                self._cache[key] = (matcher, worst, size)
                self._bytes += size
            while self._cache and (len(self._cache) > CACHE_SIZE
                                   or self._bytes > CACHE_BYTES):
                self._bytes -= self._cache.popitem(last=False)[1][2]
        return fresh, worst

    def constraint(self, spec: StructuredOutputs) -> Constraint:
        return Constraint(self.compile(spec), spec.kind)


def _first_line(message: str) -> str:
    """The engine's message on one line, at most 300 characters."""
    line = " ".join(message.split())
    return line if len(line) <= 300 else line[:297] + "..."
