"""Tools for a template that does not render them (the tiny model's ChatML): the generic
format through a real `astrai serve` and the openai client — calls whose arguments validate,
streamed as they are answered whole, answers as plain content, and a second turn."""

from __future__ import annotations

import json

import pytest

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def test_required_call_validates_and_streams_as_answered(client):
    jsonschema = pytest.importorskip("jsonschema")
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER],
                                       tool_choice="required", temperature=0, max_tokens=80)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    assert call.function.name == "get_weather"
    name, streamed = None, ""
    for chunk in client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER],
                                                tool_choice="required", temperature=0,
                                                max_tokens=80, stream=True):
        for d in chunk.choices[0].delta.tool_calls or []:
            name = d.function.name or name
            streamed += d.function.arguments or ""
    assert (name, streamed) == ("get_weather", call.function.arguments)
    # the second turn: the call and its result go back as text the template renders
    msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {
            "name": "get_weather", "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'}]
    r2 = client.chat.completions.create(model="tiny", messages=msgs, tools=[WEATHER],
                                        temperature=0, max_tokens=60)
    c2 = r2.choices[0]
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens
    # tool_choice auto: a call or an answer (whole, or cut by max_tokens), never the JSON
    # wrapper as content
    if c2.message.tool_calls:
        assert c2.finish_reason == "tool_calls"
    else:
        assert c2.message.content and not c2.message.content.startswith('{"response"')


def test_the_generic_parser_reads_answers_calls_and_cut_replies():
    from astrai.serve.tool_parsers import GenericParser

    p = GenericParser()
    assert p.parse('{"response": "Hi \\u00e9"}') == ("Hi \u00e9", [])
    content, calls = p.parse('{"tool_call": {"name": "f", "arguments": {"a": 1}}}')
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == \
        [("f", {"a": 1})]
    assert p.parse('{"response": "It is su', cut=True) == ("It is su", [])
    assert p.parse('{"response": "caf\\u00', cut=True) == ("caf", [])  # half an escape
    assert p.parse('{"tool_call": {"na', cut=True) == ('{"tool_call": {"na', [])
    assert p.segments('{"response": "par', final=False) == []  # nothing before the end
