"""Response objects and stream events of the Responses API from one chat Job's outputs.

Shapes follow the OpenAI API reference ("The response object", "Streaming events") as the
openai package's `openai.types.responses` types read them: a response has `output` items
— a `message` (role assistant, one `output_text` part) and, when the output holds tool
calls (read as chat reads them, tool_stream.py), one `function_call` item per call
(`call_id` is the id a `function_call_output` answers) — `usage` (input_tokens,
output_tokens, total_tokens) and `status`: completed, or incomplete with
`incomplete_details.reason` max_output_tokens when the token bound ended it.

A stream is `response.created`, `response.in_progress`, then per output item
`response.output_item.added`, for a message `response.content_part.added`,
`response.output_text.delta`..., `response.output_text.done`,
`response.content_part.done`, for a call `response.function_call_arguments.delta`...,
`response.function_call_arguments.done`, then `response.output_item.done`; it ends with
`response.completed` (or `response.incomplete`) carrying the whole response. Every event
has `type` and a `sequence_number` counting from 0; items come one after another (one
open at a time), as OpenAI's do.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from astrai.serve.tool_stream import ToolStream, call_id, split_output
from astrai.serve.tools import ToolPlan


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def sse_event(event: dict) -> str:
    """One server-sent event: its `event:` line names the type, as OpenAI's stream does."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


@dataclass
class ResponseHead:
    """What a response object says of its request."""

    id: str
    model: str
    echo: dict
    """The request's tools, tool_choice, text, metadata, sampling (responses_request.py)."""
    instructions: str | None
    previous_response_id: str | None
    store: bool
    created_at: int = field(default_factory=lambda: int(time.time()))


def reasoning_item(text: str, status: str) -> dict:
    """A reasoning output item: the model's thinking (astrai.infer.reasoning) as
    `reasoning_text` content, no summary (none is written)."""
    return {"type": "reasoning", "id": new_id("rs"), "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}


def message_item(text: str, status: str, item_id: str | None = None) -> dict:
    return {"type": "message", "id": item_id or new_id("msg"), "role": "assistant",
            "status": status, "content": [output_text(text)]}


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"type": "function_call", "id": new_id("fc"), "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def as_message(output: list[dict]) -> dict:
    """A response's output items as the chat message a continuation replays."""
    text = "".join(p["text"] for i in output if i["type"] == "message" for p in i["content"])
    calls = [{"id": i["call_id"], "type": "function",
              "function": {"name": i["name"], "arguments": i["arguments"]}}
             for i in output if i["type"] == "function_call"]
    msg: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        msg["tool_calls"] = calls
    return msg


class ResponsesBuilder:
    """One response's text so far, its items and the events that announce them."""

    def __init__(self, head: ResponseHead, plan: ToolPlan | None, job: Any = None) -> None:
        self.head = head
        self.split = None
        """Splits the thinking from the answer (the job's reasoning parser), or None."""
        if job is not None and job.reasoning is not None:
            self.split = job.reasoning.splitter(opened=job.thinking_open)
        self.reasoning = ""
        self.reasoning_tokens = 0
        self.delta = ("", "")
        self.parser = plan.parser if plan is not None else None
        self.limit = plan.limit if plan is not None else None
        self.text = ""
        self.output_tokens = 0
        self.prompt_tokens = self.cached_tokens = 0
        self.finish_reason: str | None = None
        self.seq = 0
        self.items: list[dict] = []
        """The output items streamed so far (the last may be open)."""
        self.open: int | None = None
        self.calls: dict[int, int] = {}
        """Tool-call index (ToolStream's) -> its output item's index."""
        self.tools = ToolStream(self.parser, self.limit) if self.parser is not None else None

    # -- bookkeeping -----------------------------------------------------------------------
    def add(self, out: Any) -> None:
        self.delta = ("", out.delta_text)
        if self.split is not None:
            think, said = self.delta = self.split.take(out.delta_text, out.finished)
            self.reasoning += think
            if self.split.thinking or (think and not said):
                self.reasoning_tokens += len(out.delta_token_ids)
        self.text += self.delta[1]
        self.output_tokens += len(out.delta_token_ids)
        self.prompt_tokens = out.usage.prompt_tokens
        self.cached_tokens = out.usage.cached_tokens
        if out.finished:
            self.finish_reason = out.finish_reason

    @property
    def cut(self) -> bool:
        return self.finish_reason == "length"

    def usage(self) -> dict:
        return {"input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": self.output_tokens,
                "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                "total_tokens": self.prompt_tokens + self.output_tokens}

    def response(self, status: str, output: list[dict], usage: dict | None) -> dict:
        h = self.head
        return {"id": h.id, "object": "response", "created_at": h.created_at,
                "status": status, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"}
                if status == "incomplete" else None,
                "instructions": h.instructions, "model": h.model, "output": output,
                "parallel_tool_calls": self.limit is None, "previous_response_id":
                h.previous_response_id, "store": h.store, "truncation": "disabled",
                **h.echo, "usage": usage}

    def status(self) -> str:
        return "incomplete" if self.cut else "completed"

    # -- whole responses -------------------------------------------------------------------
    def final_items(self) -> list[dict]:
        """The output items of the finished text (not streamed)."""
        status = self.status()
        thought = [reasoning_item(self.reasoning, "completed")] if self.reasoning else []
        if self.parser is None:
            return thought + [message_item(self.text, status)]
        content, calls = split_output(self.parser, self.text, self.limit, self.cut)
        items = [message_item(content, status)] if content or not calls else []
        return thought + items + [call_item(call_id(), c.name, c.arguments, "completed")
                                  for c in calls]

    def final(self) -> dict:
        return self.response(self.status(), self.final_items(), self.usage())

    # -- stream events ---------------------------------------------------------------------
    def event(self, type: str, **fields: Any) -> dict:
        ev = {"type": type, "sequence_number": self.seq, **fields}
        self.seq += 1
        return ev

    def start_events(self) -> list[dict]:
        snapshot = self.response("in_progress", [], None)
        return [self.event("response.created", response=snapshot),
                self.event("response.in_progress", response=snapshot)]

    def events(self, out: Any) -> list[dict]:
        """The events of one engine output."""
        self.add(out)
        evs = self._thinking(self.delta[0])
        if self.tools is None:
            return evs + self._content(self.delta[1])
        content, entries = self.tools.push(self.text, out.finished)
        evs += self._content(content)
        for e in entries:
            evs += self._call(e)
        return evs

    def end_events(self) -> list[dict]:
        evs = self._close()
        if all(i["type"] == "reasoning" for i in self.items):  # no answer: an empty message
            evs += self._open(message_item("", "in_progress"))
            evs += self._close()
        status = self.status()
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return evs + [self.event(kind, response=self.final_streamed())]

    def final_streamed(self) -> dict:
        return self.response(self.status(), self.items, self.usage())

    def _open(self, item: dict) -> list[dict]:
        evs = self._close()
        self.items.append(item)
        self.open = len(self.items) - 1
        added = json.loads(json.dumps(item))
        if item["type"] == "message":  # its part is announced next, as OpenAI's stream does
            added["content"] = []
        evs.append(self.event("response.output_item.added", output_index=self.open,
                              item=added))
        if item["type"] == "message":
            evs.append(self.event("response.content_part.added", item_id=item["id"],
                                  output_index=self.open, content_index=0,
                                  part=output_text("")))
        return evs

    def _thinking(self, delta: str) -> list[dict]:
        if not delta:
            return []
        evs = []
        if self.open is None or self.items[self.open]["type"] != "reasoning":
            evs += self._open(reasoning_item("", "in_progress"))
        item = self.items[self.open]
        item["content"][0]["text"] += delta
        evs.append(self.event("response.reasoning_text.delta", item_id=item["id"],
                              output_index=self.open, content_index=0, delta=delta))
        return evs

    def _content(self, delta: str) -> list[dict]:
        if not delta:
            return []
        evs = []
        if self.open is None or self.items[self.open]["type"] != "message":
            evs += self._open(message_item("", "in_progress"))
        item = self.items[self.open]
        item["content"][0]["text"] += delta
        evs.append(self.event("response.output_text.delta", item_id=item["id"],
                              output_index=self.open, content_index=0, delta=delta,
                              logprobs=[]))
        return evs

    def _call(self, entry: dict) -> list[dict]:
        evs = []
        f = entry["function"]
        if "id" in entry:
            evs += self._open(call_item(entry["id"], f["name"], "", "in_progress"))
            self.calls[entry["index"]] = self.open
        index = self.calls[entry["index"]]
        if f.get("arguments"):
            item = self.items[index]
            item["arguments"] += f["arguments"]
            evs.append(self.event("response.function_call_arguments.delta",
                                  item_id=item["id"], output_index=index,
                                  delta=f["arguments"]))
        return evs

    def _close(self) -> list[dict]:
        if self.open is None:
            return []
        index, self.open = self.open, None
        item = self.items[index]
        # the token bound cut the last item (a call's arguments already sent stay sent)
        item["status"] = "incomplete" if self.cut and index == len(self.items) - 1 \
            else "completed"
        evs = []
        if item["type"] == "reasoning":
            evs.append(self.event("response.reasoning_text.done", item_id=item["id"],
                                  output_index=index, content_index=0,
                                  text=item["content"][0]["text"]))
        elif item["type"] == "message":
            part = item["content"][0]
            evs.append(self.event("response.output_text.done", item_id=item["id"],
                                  output_index=index, content_index=0, text=part["text"],
                                  logprobs=[]))
            evs.append(self.event("response.content_part.done", item_id=item["id"],
                                  output_index=index, content_index=0, part=dict(part)))
        else:
            evs.append(self.event("response.function_call_arguments.done",
                                  item_id=item["id"], output_index=index,
                                  arguments=item["arguments"]))
        return evs + [self.event("response.output_item.done", output_index=index,
                                 item=json.loads(json.dumps(item)))]
