"""OpenAI request bodies -> prompts and SamplingParams, validated field by field.

Follows the OpenAI API reference ("Create chat completion", "Create completion") and the
extra sampling fields vLLM accepts (top_k, min_p, repetition_penalty, ignore_eos,
stop_token_ids, include_stop_str_in_output). A null field counts as absent. Any other
field, or a field with a value we cannot honour, is a 400 naming it: never silently
ignored. With `n` > 1 and a seed, choice i uses seed + i (as vLLM does; modulo 2**64), so
the choices differ and the whole response is reproducible. The sizes a request may have
(prompts, messages, stop strings, n) are bounded in limits.py.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from astrai.errors import ConfigError
from astrai.infer.params import SEED_RANGE, SamplingParams
from astrai.infer.structured import StructuredOutputs
from astrai.serve.constraints import read_constraint
from astrai.serve.errors import bad_request
from astrai.serve.generic_tools import generic_messages, generic_schema
from astrai.serve.limits import (
    MAX_N,
    MAX_PROMPTS,
    MAX_STOP,
    MAX_STOP_CHARS,
    MAX_TOP_LOGPROBS,
)
from astrai.serve.messages import read_messages
from astrai.serve.prompts import chat_prompt
from astrai.serve.tool_grammar import tool_grammar
from astrai.serve.tools import ToolPlan, read_tools

SAMPLING = {"max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n",
            "frequency_penalty", "presence_penalty", "repetition_penalty", "ignore_eos",
            "stop_token_ids", "include_stop_str_in_output", "stream", "stream_options",
            "logprobs", "model", "user"}
SAMPLING |= {"response_format", "structured_outputs"}
CHAT_FIELDS = SAMPLING | {"messages", "max_completion_tokens", "top_logprobs", "tools",
                          "tool_choice", "parallel_tool_calls", "chat_template_kwargs"}
TEMPLATE_KWARGS = ("enable_thinking", "thinking")
"""`chat_template_kwargs` keys a request may set (booleans read by thinking templates: Qwen3's
enable_thinking, others' thinking); anything else could reach into the template's logic."""
COMPLETION_FIELDS = SAMPLING | {"prompt"}
HARMLESS = {"echo": False, "best_of": 1, "logit_bias": {}, "tools": [], "tool_choice": "none",
            "parallel_tool_calls": False}
"""Fields we do not implement, accepted only at the value that means "not used"."""


@dataclass
class Job:
    """One validated HTTP request: its prompts and the params of each choice."""

    kind: Literal["chat", "completion"]
    model: str | None
    prompts: list[list[int]]
    """Prompt ids (one for chat; a completions batch may give several)."""
    params: list[SamplingParams]
    """Per choice, n per prompt: choice index = prompt index * n + j."""
    n: int
    stream: bool
    include_usage: bool
    top_logprobs: int | None
    """None: no logprobs; else how many alternatives per token (0 = only the chosen one)."""
    tools: ToolPlan | None = None
    """How a chat request uses tools (tools.py); None without tools."""
    constrained_by: str | None = None
    """The field whose constraint every choice follows (response_format,
    structured_outputs, tools: a required or named tool call); None: free text."""
    reasoning: Any = None
    """The reasoning parser splitting the thinking from the answer (astrai.infer.reasoning);
    None: the output is all answer."""
    thinking_open: bool = False
    """The prompt ends inside a thinking block (the reply starts thinking)."""


def choice_seed(seed: int, j: int) -> int:
    """Choice j's seed: seed + j (vLLM's rule), wrapped modulo 2**64 above SEED_RANGE so
    that every seed a client may send works with any n (2**64 - 1 with n = 2: 2**64 - 1,
    then 0). The sampler reads a seed modulo 2**64 (sampling_math.seed_for), so the
    wrapped seeds still differ."""
    s = seed + j
    return s - 2**64 if s > SEED_RANGE[1] else s


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _num(body: dict, key: str, lo: float | None = None, hi: float | None = None, *,
         lo_open: bool = False, integer: bool = False) -> Any:
    v = body.get(key)
    if v is None:
        return None
    kind = "an integer" if integer else "a number"
    if not _is_num(v) or (integer and not isinstance(v, int)):
        raise bad_request(f"'{key}' must be {kind}, got {reprlib.repr(v)}", key)
    low_bad = lo is not None and (v <= lo if lo_open else v < lo)
    if low_bad or (hi is not None and v > hi):
        left = "(" if lo_open else "["
        raise bad_request(f"'{key}' must be in {left}{lo}, {hi if hi is not None else 'inf'}"
                          f"], got {reprlib.repr(v)}", key)
    return v


def _bool(body: dict, key: str) -> bool | None:
    v = body.get(key)
    if v is not None and not isinstance(v, bool):
        raise bad_request(f"'{key}' must be true or false, got {reprlib.repr(v)}", key)
    return v


def check_fields(body: Any, allowed: set[str], harmless: dict[str, Any] = HARMLESS) -> dict:
    """`body` as a dict whose every key is `allowed`, None, or at its `harmless` value (a
    field not implemented, sent at the value that means "not used"); a 400 naming the key."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    for key, value in body.items():
        if key in allowed or value is None:
            continue
        if key in harmless and value == harmless[key]:
            continue
        raise bad_request(f"parameter '{key}' is not supported by astrai serve; remove it",
                          key, "unsupported_parameter")
    return body


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad_request("'stop' must be a non-empty string or a list of them", "stop")
    if len(stops) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in stops):
        raise bad_request(f"'stop' allows at most {MAX_STOP} strings of at most "
                          f"{MAX_STOP_CHARS} characters each; got {len(stops)} strings, the "
                          f"longest {max(map(len, stops))} characters", "stop")
    return stops


def _token_ids(body: dict, key: str) -> list[int]:
    v = body.get(key) or []
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                          and t >= 0 for t in v):
        raise bad_request(f"'{key}' must be a list of token ids >= 0", key)
    if len(v) > MAX_STOP:
        raise bad_request(f"'{key}' allows at most {MAX_STOP} token ids; got {len(v)}", key)
    return v


def _sampling(body: dict, max_tokens_key: str, default_seed: int | None) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    for key, args in {"temperature": (0, None), "top_p": (0, 1), "min_p": (0, 1),
                      "frequency_penalty": (-2, 2), "presence_penalty": (-2, 2),
                      "repetition_penalty": (0, None)}.items():
        v = _num(body, key, *args, lo_open=key in ("top_p", "repetition_penalty"))
        if v is not None:
            kw[key] = float(v)
    top_k = _num(body, "top_k", -1, None, integer=True)
    if top_k is not None:
        kw["top_k"] = top_k
    seed = _num(body, "seed", SEED_RANGE[0], SEED_RANGE[1], integer=True)
    kw["seed"] = seed if seed is not None else default_seed
    for key in ("ignore_eos", "include_stop_str_in_output"):
        if _bool(body, key) is not None:
            kw[key] = body[key]
    kw["stop"] = _stop(body)
    kw["stop_token_ids"] = _token_ids(body, "stop_token_ids")
    mt = _num(body, max_tokens_key, 1, None, integer=True)
    if max_tokens_key == "max_completion_tokens" and mt is None:
        mt = _num(body, "max_tokens", 1, None, integer=True)
    kw["max_tokens"] = mt
    return kw


def _stream(body: dict) -> tuple[bool, bool]:
    stream = bool(_bool(body, "stream"))
    opts = body.get("stream_options")
    if opts is None:
        return stream, False
    if not stream:
        raise bad_request("'stream_options' is only allowed with stream=true", "stream_options")
    if not isinstance(opts, dict) or set(opts) - {"include_usage"}:
        raise bad_request("'stream_options' supports only {\"include_usage\": bool}",
                          "stream_options")
    return stream, bool(_bool(opts, "include_usage"))


def _completion_prompts(body: dict, tokenizer: Any, max_chars: int | None
                        ) -> list[list[int] | str]:
    p = body.get("prompt")
    err = bad_request("'prompt' must be a string, a list of strings, a list of token ids or "
                      "a list of lists of token ids", "prompt")

    def ids_ok(x: Any) -> bool:
        return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                           for t in x)

    if isinstance(p, str):
        prompts: list = [p]
    elif ids_ok(p) and p:
        prompts = [p]
    elif isinstance(p, list) and p and all(isinstance(s, str) or ids_ok(s) for s in p):
        prompts = list(p)
    else:
        raise err
    if len(prompts) > MAX_PROMPTS:
        raise bad_request(f"'prompt' holds {len(prompts)} prompts; at most {MAX_PROMPTS} per "
                          "request", "prompt")
    if any(isinstance(s, str) for s in prompts) and tokenizer is None:
        raise bad_request("this model has no tokenizer: send the prompt as token ids", "prompt")
    longest = max((len(s) for s in prompts if isinstance(s, str)), default=0)
    if max_chars is not None and longest > max_chars:
        raise bad_request(f"'prompt' holds a text of {longest} characters; this model's "
                          f"context takes at most {max_chars} (its context times its longest "
                          "token's characters): shorten the prompt", "prompt",
                          "context_length_exceeded")
    return prompts


def _tokenize(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of each text. A batch call where the tokenizer has one: the HF tokenizers
    library releases the GIL while it encodes a batch (and skips character offsets), so a
    long prompt does not stall the event loop's thread; `encode` holds the GIL throughout."""
    if not texts:
        return []
    batch = getattr(tokenizer, "encode_batch", None)
    return batch(texts) if batch is not None else [tokenizer.encode(t) for t in texts]


def parse(kind: Literal["chat", "completion"], body: Any, *, tokenizer: Any, vocab_size: int,
          max_context: int, default_seed: int | None = None,
          admit: Callable[[int], None] | None = None, tool_parser: str | None = None,
          max_prompt_chars: int | None = None, max_request_tokens: int | None = None,
          reasoning: Any = None) -> Job:
    """Validate one request body into a Job; raises APIError (400) naming the field.
    `tool_parser` is the server's `--tool-call-parser` (None: chosen from the template);
    `max_prompt_chars`: the longest prompt text the context could take;
    `max_request_tokens`: the most tokens all choices together may generate (limits.py);
    `reasoning`: the server's reasoning parser (None: none).

    `admit(k)` is called with the request's number of choices (prompts x n) once the body
    is validated and before any prompt is tokenized or rendered and any SamplingParams
    built: a request that cannot be served now costs no more than its validation."""
    body = check_fields(body, CHAT_FIELDS if kind == "chat" else COMPLETION_FIELDS)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    n = _num(body, "n", 1, MAX_N, integer=True) or 1
    stream, include_usage = _stream(body)
    top_logprobs, kw, raw = _prompt_source(kind, body, tokenizer, default_seed,
                                           max_prompt_chars)
    if kw["stop"] and tokenizer is None:
        raise bad_request("'stop' strings need a tokenizer; use stop_token_ids", "stop")
    template = getattr(tokenizer, "chat_template", None)
    plan = read_tools(body, template, tool_parser) if kind == "chat" else None
    kw["structured_outputs"], where = _constraint(body, plan, tokenizer)
    extra = _template_kwargs(body) if kind == "chat" else None
    if admit is not None:
        admit(len(raw) * n)
    opened = False
    if kind == "chat":
        messages, tools = raw[0], plan.tools if plan else None
        if plan is not None and plan.generic:  # tools in a system message (generic_tools.py)
            messages = generic_messages(messages, plan) if plan.parser else messages
            tools = None
        ids, text = chat_prompt(tokenizer, messages, tools, max_prompt_chars, extra)
        raw, opened = [ids], reasoning is not None and reasoning.opens_thinking(text)
    ids = iter(_tokenize(tokenizer, [p for p in raw if isinstance(p, str)]))
    prompts = [next(ids) if isinstance(p, str) else list(p) for p in raw]
    for ids in prompts:
        _check_prompt(ids, kw["max_tokens"], vocab_size, max_context)
    if max_request_tokens is not None:
        _check_request_tokens(body, prompts, kw["max_tokens"], n, max_context,
                              max_request_tokens)
    params = []
    for ids in prompts:
        room = max_context - len(ids)
        for j in range(n):
            pk = dict(kw, max_tokens=kw["max_tokens"] or room)
            if pk["seed"] is not None:
                pk["seed"] = choice_seed(pk["seed"], j)
            if top_logprobs is not None:
                pk.update(logprobs=True, top_logprobs=top_logprobs)
            params.append(_params(pk))
    return Job(kind, model, prompts, params, n, stream, include_usage, top_logprobs, plan,
               where, reasoning if kind == "chat" else None, opened)


def _template_kwargs(body: dict) -> dict[str, Any] | None:
    """`chat_template_kwargs`: an object of TEMPLATE_KWARGS booleans (400 otherwise)."""
    kw = body.get("chat_template_kwargs")
    if kw is None:
        return None
    if not isinstance(kw, dict):
        raise bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    for key, value in kw.items():
        if key not in TEMPLATE_KWARGS:
            raise bad_request(f"'chat_template_kwargs.{key}' is not allowed; use "
                              f"{', '.join(TEMPLATE_KWARGS)}", f"chat_template_kwargs.{key}")
        if not isinstance(value, bool):
            raise bad_request(f"'chat_template_kwargs.{key}' must be true or false",
                              f"chat_template_kwargs.{key}")
    return kw


def _constraint(body: dict, plan: ToolPlan | None, tokenizer: Any
                ) -> tuple[StructuredOutputs | None, str | None]:
    """The request's constraint and the field it comes from: a required or named tool
    call (its grammar, tool_grammar.py), else response_format / structured_outputs."""
    spec = read_constraint(body)
    if plan is not None and plan.generic and plan.parser is not None:
        if spec is not None:
            raise bad_request("this model's template does not render tools, so its replies "
                              "follow the generic tool format; drop 'response_format' / "
                              "'structured_outputs' or 'tools'", "response_format")
        return StructuredOutputs(json=generic_schema(plan)), "tools"
    if plan is not None and plan.enforced:
        if spec is not None:
            raise bad_request("a required or named 'tool_choice' already constrains the "
                              "output; drop 'response_format' / 'structured_outputs'",
                              "tool_choice")
        # what the grammar engine refuses in it comes from the tools' parameters
        return StructuredOutputs(grammar=tool_grammar(plan, tokenizer.token_to_id)), "tools"
    if spec is None:
        return None, None
    if tokenizer is None:
        raise bad_request("structured outputs need the model's tokenizer", "response_format")
    return spec, "structured_outputs" if "structured_outputs" in body else "response_format"


def _prompt_source(kind: str, body: dict, tokenizer: Any, default_seed: int | None,
                   max_chars: int | None = None) -> tuple[int | None, dict[str, Any], list]:
    """(top_logprobs, sampling kwargs, the prompts still untokenized: for chat one
    validated message list, for completions strings or token-id lists)."""
    if kind == "chat":
        lp = _bool(body, "logprobs")
        top = _num(body, "top_logprobs", 0, MAX_TOP_LOGPROBS, integer=True)
        if top is not None and not lp:
            raise bad_request("'top_logprobs' needs logprobs=true", "top_logprobs")
        kw = _sampling(body, "max_completion_tokens", default_seed)
        msgs = read_messages(body)
        if tokenizer is None:
            raise bad_request("this model has no tokenizer: use /v1/completions with token ids")
        return (top or 0) if lp else None, kw, [msgs]
    top_logprobs = _num(body, "logprobs", 0, MAX_TOP_LOGPROBS, integer=True)
    kw = _sampling(body, "max_tokens", default_seed)
    return top_logprobs, kw, _completion_prompts(body, tokenizer, max_chars)


def _check_request_tokens(body: dict, prompts: list[list[int]], max_tokens: int | None,
                          n: int, ctx: int, bound: int) -> None:
    """n x max_tokens over the prompts (max_tokens absent: the context left after each
    prompt) at most `bound`, the server's KV pool: one request may not ask for more pages
    than the pool holds, nor, unread, keep the server producing that much."""
    total = sum(n * (max_tokens or ctx - len(ids)) for ids in prompts)
    if total <= bound:
        return
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    per = bound // (n * len(prompts))
    raise bad_request(f"this request may generate {total} tokens (prompts x n x '{key}'"
                      f"{'' if max_tokens else ', the context left when absent'}); this "
                      f"server allows {bound} per request (its KV pool, --max-kv-tokens): "
                      f"give '{key}' <= {per} or a smaller n", key)


def _check_prompt(ids: list[int], max_tokens: int | None, vocab: int, ctx: int) -> None:
    if not ids:
        raise bad_request("the prompt is empty: give at least one token", "prompt")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise bad_request(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab})",
                          "prompt")
    want = len(ids) + (max_tokens or 1)
    if want > ctx:
        raise bad_request(
            f"This model's maximum context length is {ctx} tokens. However, you requested "
            f"{want} tokens ({len(ids)} in the messages, {max_tokens or 1} in the "
            "completion). Please reduce the length of the messages or completion.",
            "messages", "context_length_exceeded")


def _params(kw: dict[str, Any]) -> SamplingParams:
    try:
        return SamplingParams(**kw)
    except ConfigError as e:  # "sampling top_p=2.0: must be in (0, 1]"
        field = str(e).removeprefix("sampling ").split("=", 1)[0]
        raise bad_request(str(e), field) from None
