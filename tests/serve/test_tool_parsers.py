"""Tool-call parsers (hermes, llama3_json, mistral): calls parsed whole and streamed, text
outside calls kept as content, malformed or cut-off calls left as content, and a stream's
pieces adding up to the non-streamed answer however the text is chunked."""

from __future__ import annotations

import json
import re

import pytest

from astrai.serve.tool_parsers import (
    PARSERS,
    HermesParser,
    Llama3JsonParser,
    MistralParser,
    ToolCall,
    parser_for_template,
)
from astrai.serve.tool_stream import ToolStream, call_id, message, split_output

H, L, M = HermesParser(), Llama3JsonParser(), MistralParser()
W = ToolCall("get_weather", '{"city": "Paris", "days": [1, 2]}')

PARSED = [  # (parser, output, content, calls)
    (H, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}'
        '\n</tool_call>', None, [W]),
    (H, 'Let me look.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "g", "arguments": {"s": "a \\"}\\" b"}}\n</tool_call>\nDone.',
     "Let me look.Done.", [ToolCall("f", "{}"), ToolCall("g", '{"s": "a \\"}\\" b"}')]),
    # another key order: arguments re-serialised
    (H, '<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call>', None,
     [ToolCall("f", '{"x": 1}')]),
    # the closing tag never came (the model stopped after the JSON)
    (H, '<tool_call>\n{"name": "f", "arguments": {"x": "深红"}}\n', None,
     [ToolCall("f", '{"x": "深红"}')]),
    (L, '{"name": "get_weather", "parameters": {"city": "Paris", "days": [1, 2]}}', None, [W]),
    (L, '<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", "arguments": {"a": 1}}',
     None, [ToolCall("f", "{}"), ToolCall("g", '{"a": 1}')]),
    (M, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}]',
     None, [W]),
    (M, 'Sure. [TOOL_CALLS] [{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]',
     "Sure.", [ToolCall("f", "{}"), ToolCall("g", "{}")]),
    # [TOOL_CALLS] is a special token the detokenizer drops
    (M, '[{"name": "f", "arguments": {"a": null}}]', None, [ToolCall("f", '{"a": null}')]),
]

MALFORMED = [  # parser, output, whether a stream announces the call before it turns out
    # malformed (it cannot take it back; see tool_stream.py): no call, all of it content
    (H, "plain text, no tools", False),
    (H, "<tool_call>\nnot json at all\n</tool_call>", False),
    (H, '<tool_call>{"name": "f", "arguments": {"a": 1}', True),  # cut off by max_tokens
    (H, '<tool_call>{"name": "f", "arguments": [1]}</tool_call>', False),  # not an object
    (H, '<tool_call>{"name": "f", "arguments": {}} trailing</tool_call>', True),
    (H, '<tool_call>{"name": "", "arguments": {}}</tool_call>', False),
    (L, "The weather is fine.", False),
    (L, '{"city": "Paris"}', False),  # JSON, but no call
    (L, '{"name": "f", "parameters": {"a": 1}} and then text', True),
    (L, '{"name": "f", "parameters": {"a": ', True),
    (L, 'Sure: {"name": "f", "parameters": {}}', False),  # a call must be the whole reply
    (M, "[1, 2, 3]", False),
    (M, '[TOOL_CALLS][{"name": "f", "arguments": {}}, oops]', True),
    (M, '[TOOL_CALLS][{"name": "f"', False),
]


@pytest.mark.parametrize(("parser", "text", "content", "calls"), PARSED)
def test_calls_are_parsed_and_text_outside_them_is_content(parser, text, content, calls):
    assert parser.parse(text) == (content, calls)
    for c in calls:
        assert isinstance(json.loads(c.arguments), dict)


@pytest.mark.parametrize(("parser", "text", "announced"), MALFORMED)
def test_malformed_output_stays_content(parser, text, announced):
    assert parser.parse(text) == (text, [])
    msg = message(parser, text, None)
    assert msg == {"role": "assistant", "content": text}


def _stream(parser, text: str, step: int, limit=None) -> tuple[str, list[ToolCall], list]:
    st = ToolStream(parser, limit)
    content, calls, entries = "", {}, []
    cuts = list(range(step, len(text), step)) + [len(text)]
    for end in cuts:
        piece, new = st.push(text[:end], final=end == len(text))
        content += piece
        entries += new
        for e in new:
            c = calls.setdefault(e["index"], {"name": None, "args": ""})
            if "id" in e:
                assert c["name"] is None and re.fullmatch(r"call_[0-9a-f]{24}", e["id"])
                assert e["type"] == "function"
                c["name"] = e["function"]["name"]
            c["args"] += e["function"]["arguments"]
    return content, [ToolCall(c["name"], c["args"]) for _, c in sorted(calls.items())], entries


@pytest.mark.parametrize("step", [1, 2, 5, 11, 10_000])
@pytest.mark.parametrize(("parser", "text", "content", "calls"), PARSED)
def test_streamed_pieces_add_up_to_the_whole_answer(parser, text, content, calls, step):
    got_content, got_calls, entries = _stream(parser, text, step)
    assert got_content == (content or "") and got_calls == calls
    if step == 1 and calls and '{"arguments"' not in text:
        # the name goes out before the arguments are complete (calls in another key order
        # go out whole)
        first_args = [e for e in entries if "id" not in e]
        assert first_args, "arguments were not streamed in pieces"


@pytest.mark.parametrize("step", [1, 3, 10_000])
@pytest.mark.parametrize(("parser", "text", "announced"), MALFORMED)
def test_streamed_malformed_output_is_content(parser, text, announced, step):
    content, calls, _ = _stream(parser, text, step)
    if announced and step < len(text):  # the call's head went out; the rest follows as text
        assert calls and calls[0].name == "f" and content.endswith(text[-3:])
    else:
        assert (content, calls) == (text, [])


def test_plain_text_streams_as_it_comes_except_a_possible_marker():
    st = ToolStream(H, None)
    assert st.push("Hello wor", False) == ("Hello wor", [])
    assert st.push("Hello world <tool", False) == ("ld", [])  # "<tool" may open a call
    assert st.push("Hello world <tools are fun", False) == (" <tools are fun", [])
    assert st.push("Hello world <tools are fun", True) == ("", [])


def test_parallel_false_keeps_the_first_call():
    text = ('<tool_call>{"name": "f", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "g", "arguments": {}}</tool_call>')
    assert split_output(H, text, 1) == (None, [ToolCall("f", "{}")])
    assert _stream(H, text, 4, limit=1)[1] == [ToolCall("f", "{}")]
    msg = message(H, text, None)
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["f", "g"]
    assert msg["content"] is None and len({c["id"] for c in msg["tool_calls"]}) == 2


def test_parser_is_chosen_from_the_template_call_syntax():
    from tests.real_tokenizers import FIXTURES

    qwen = json.loads((FIXTURES / "qwen3" / "tokenizer_config.json").read_text())
    assert parser_for_template(qwen["chat_template"]) == "hermes"
    llama = (FIXTURES / "llama3.1-style" / "chat_template.jinja").read_text()
    assert parser_for_template(llama) == "llama3_json"
    assert parser_for_template("{{ '[TOOL_CALLS]' + tool_calls|tojson }}") == "mistral"
    assert parser_for_template("{{ messages[0]['content'] }}") is None
    assert set(PARSERS) == {"hermes", "llama3_json", "mistral"}
    assert call_id() != call_id()


def test_a_call_whose_end_marker_max_tokens_cut_stays_content():
    """docs/serve.md: a call cut off by max_tokens stays content, also when its JSON is
    complete and only `</tool_call>` is missing; the same text ended by the model (EOS)
    is a call, and a closed call cut after its marker is still one."""
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n'
    assert message(H, text, None, cut=True) == {"role": "assistant", "content": text}
    assert message(H, text, None)["tool_calls"][0]["function"]["name"] == "f"
    closed = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\nMore'
    msg = message(H, closed, None, cut=True)
    assert msg["content"] == "More" and msg["tool_calls"][0]["function"]["arguments"] == \
        '{"a": 1}'
