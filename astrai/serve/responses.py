"""OpenAI response objects from engine outputs: chat.completion(.chunk), text_completion.

Shapes follow the OpenAI API reference: a choice's logprobs are
`{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}` for chat and
`{"tokens", "token_logprobs", "top_logprobs", "text_offset"}` for completions; usage has
prompt_tokens, completion_tokens, total_tokens and prompt_tokens_details.cached_tokens.
A stream sends one chunk per generated token (the first chat chunk of a choice also
carries the role), then, with stream_options.include_usage, a chunk with empty choices
and the usage (every earlier chunk has "usage": null), then `data: [DONE]`.
With tools, a chat choice's text is read for tool calls (tool_stream.py): they go to
`message.tool_calls` / `delta.tool_calls`, and a choice that stopped with calls finishes
with "tool_calls".
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from astrai.serve.protocol import Job
from astrai.serve.tool_stream import ToolStream, message

MASKED_LOGPROB = -9999.0
"""The log-probability sent for a token a structured-output grammar masked out."""


def sse(obj: dict | str) -> str:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"data: {data}\n\n"


@dataclass
class Choice:
    """What the client has received of one choice so far."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[dict[int, float]] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    started: bool = False
    tools: ToolStream | None = None
    """The tool calls streamed so far, when the request's output is read for them."""
    split: Any = None
    """Splits the thinking from the answer (astrai.infer.reasoning), with a reasoning parser."""
    reasoning: str = ""
    """The thinking so far (`text` is then the answer alone)."""
    delta: tuple[str, str] = ("", "")
    """(thinking, answer) of the latest output."""


class ResponseBuilder:
    def __init__(self, job: Job, request_id: str, model: str, tokenizer: Any) -> None:
        self.job = job
        self.id = request_id
        self.model = model
        self.tok = tokenizer
        self.created = int(time.time())
        self.choices = [Choice() for _ in job.params]
        self.chat = job.kind == "chat"
        plan = job.tools
        self.parser = plan.parser if plan is not None else None
        self.limit = plan.limit if plan is not None else None
        if self.parser is not None and job.stream:
            for c in self.choices:
                c.tools = ToolStream(self.parser, self.limit)
        if job.reasoning is not None:
            for c in self.choices:
                c.split = job.reasoning.splitter(opened=job.thinking_open)

    # -- bookkeeping -----------------------------------------------------------------------
    def add(self, index: int, out: Any) -> Choice:
        c = self.choices[index]
        c.delta = ("", out.delta_text)
        if c.split is not None:
            c.delta = c.split.take(out.delta_text, out.finished)
            c.reasoning += c.delta[0]
        c.text += c.delta[1]
        c.tokens += out.delta_token_ids
        if out.delta_logprobs:
            c.logprobs += out.delta_logprobs
            c.top += out.delta_top_logprobs or [{} for _ in out.delta_logprobs]
        c.prompt_tokens, c.cached_tokens = out.usage.prompt_tokens, out.usage.cached_tokens
        if out.finished:
            c.finish_reason = out.finish_reason
        return c

    def usage(self) -> dict[str, Any]:
        n = self.job.n
        firsts = self.choices[::n]  # prompt tokens count once per prompt, not per choice
        prompt = sum(c.prompt_tokens for c in firsts)
        done = sum(len(c.tokens) for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": done,
                "total_tokens": prompt + done,
                "prompt_tokens_details": {"cached_tokens": sum(c.cached_tokens for c in firsts)}}

    # -- logprobs --------------------------------------------------------------------------
    def _piece(self, t: int) -> str:
        return self.tok.decode([t], skip_special_tokens=False) if self.tok else str(t)

    def _logprobs(self, c: Choice, start: int, text_offset: int = 0) -> dict | None:
        """With a constraint a masked-out token's log-probability (-inf) is sent as
        MASKED_LOGPROB (JSON has no infinity; vLLM's convention)."""
        if self.job.top_logprobs is None:
            return None
        lps = [max(lp, MASKED_LOGPROB) for lp in c.logprobs[start:]]
        tops = [{a: max(b, MASKED_LOGPROB) for a, b in top.items()} for top in c.top[start:]]
        toks = c.tokens[start:start + len(lps)]
        if self.chat:
            def entry(t: int, lp: float) -> dict:
                s = self._piece(t)
                return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}

            return {"content": [
                {**entry(t, lp), "top_logprobs": [entry(a, b) for a, b in top.items()]}
                for t, lp, top in zip(toks, lps, tops)]}
        pieces = [self._piece(t) for t in toks]
        offsets, off = [], text_offset
        for p in pieces:
            offsets.append(off)
            off += len(p)
        return {"tokens": pieces, "token_logprobs": lps,
                "top_logprobs": [{self._piece(a): b for a, b in top.items()} for top in tops],
                "text_offset": offsets}

    # -- whole responses -------------------------------------------------------------------
    def final(self) -> dict[str, Any]:
        choices = []
        for i, c in enumerate(self.choices):
            if self.chat:
                msg = ({"role": "assistant", "content": c.text} if self.parser is None
                       else message(self.parser, c.text, self.limit,
                                    cut=c.finish_reason == "length"))
                if c.split is not None:  # vLLM's field (also SGLang's, llama.cpp's)
                    msg["reasoning_content"] = c.reasoning or None
                choices.append({"index": i, "message": msg, "logprobs": self._logprobs(c, 0),
                                "finish_reason": _finish(c.finish_reason, "tool_calls" in msg)})
            else:
                choices.append({"index": i, "text": c.text, "logprobs": self._logprobs(c, 0),
                                "finish_reason": c.finish_reason})
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices,
                "usage": self.usage()}

    # -- stream chunks ---------------------------------------------------------------------
    def _chunk(self, choices: list[dict], usage: dict | None = None) -> dict[str, Any]:
        obj = {"id": self.id, "object": "chat.completion.chunk" if self.chat
               else "text_completion", "created": self.created, "model": self.model,
               "choices": choices}
        if self.job.include_usage:
            obj["usage"] = usage
        return obj

    def chunks(self, index: int, out: Any) -> list[dict[str, Any]]:
        """The chunks to send for one engine output of choice `index`."""
        c = self.choices[index]
        start, text_before = len(c.tokens), len(c.text)
        self.add(index, out)
        res = []
        if self.chat and not c.started:
            res.append(self._chunk([{"index": index, "delta": {"role": "assistant",
                                                                "content": ""},
                                     "logprobs": None, "finish_reason": None}]))
        c.started = True
        lp = self._logprobs(c, start, text_before)
        if self.chat and c.tools is not None:
            body = {"index": index, "delta": self._tool_delta(c, out.finished), "logprobs": lp,
                    "finish_reason": _finish(c.finish_reason, c.tools.called)}
        elif self.chat:
            think, said = c.delta
            delta = {"reasoning_content": think} if think else {}
            if said:
                delta["content"] = said
            body = {"index": index, "delta": delta, "logprobs": lp,
                    "finish_reason": c.finish_reason}
        else:
            body = {"index": index, "text": out.delta_text, "logprobs": lp,
                    "finish_reason": c.finish_reason}
        res.append(self._chunk([body]))
        return res

    @staticmethod
    def _tool_delta(c: Choice, final: bool) -> dict[str, Any]:
        content, calls = c.tools.push(c.text, final)
        delta: dict[str, Any] = {"content": content} if content else {}
        if c.delta[0]:
            delta["reasoning_content"] = c.delta[0]
        if calls:
            delta["tool_calls"] = calls
        return delta

    def usage_chunk(self) -> dict[str, Any]:
        return self._chunk([], self.usage())


def _finish(reason: str | None, called: bool) -> str | None:
    """A choice that stopped after making tool calls finishes with "tool_calls"."""
    return "tool_calls" if called and reason == "stop" else reason
