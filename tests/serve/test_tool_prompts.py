"""Chat requests with tools -> prompt ids equal to transformers' `apply_chat_template(
messages, tools=..., add_generation_prompt=True, tokenize=True)`, for Qwen3's template and
Llama 3.1's tool-aware one: OpenAI-shaped bodies (tool_calls with JSON-string arguments,
tool results) go through the server's own validation (`protocol.parse`), transformers gets
the conversation as its docs write it (arguments as dicts)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap

import pytest

from astrai.data.tokenizer import Tokenizer
from astrai.serve.errors import APIError
from astrai.serve.protocol import parse

pytest.importorskip("transformers")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather — ünïcode, <b>tags</b> & 'quotes'",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
BARE = {"type": "function", "function": {"name": "now"}}


def call(i: int, name: str, args: dict) -> dict:
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}


ASK = {"role": "user", "content": "What is the weather in Paris, and 2+3?"}
CALLED = {"role": "assistant", "content": None,
          "tool_calls": [call(1, "get_weather", {"city": "Paris", "unit": "celsius"})]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'}
BOTH = {"role": "assistant", "content": "Checking both.",
        "tool_calls": [call(1, "get_weather", {"city": "Paris"}), call(2, "add", {"a": 2,
                                                                                  "b": 3})]}
CASES = {  # name -> (families, body)
    "one tool": (("qwen3", "llama3.1"), {"messages": [ASK], "tools": [WEATHER]}),
    "system and three tools": (("qwen3", "llama3.1"), {
        "messages": [{"role": "system", "content": "Be brief."}, ASK],
        "tools": [WEATHER, ADD, BARE], "tool_choice": "auto"}),
    "a call and its result": (("qwen3", "llama3.1"), {
        "messages": [ASK, CALLED, RESULT], "tools": [WEATHER, ADD]}),
    "the answer after a result": (("qwen3", "llama3.1"), {
        "messages": [ASK, CALLED, RESULT, {"role": "assistant", "content": "21 degrees."},
                     {"role": "user", "content": "Thanks"}], "tools": [WEATHER]}),
    "parallel calls and results": (("qwen3",), {
        "messages": [{"role": "system", "content": "Use tools."}, ASK, BOTH, RESULT,
                     {"role": "tool", "tool_call_id": "call_2", "content": "5"}],
        "tools": [WEATHER, ADD], "parallel_tool_calls": True}),
    "tool_choice none still shows the tools": (("qwen3", "llama3.1"), {
        "messages": [ASK], "tools": [ADD], "tool_choice": "none"}),
    "content parts": (("qwen3",), {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "2+3?"}]}],
        "tools": [ADD]}),
}


def hf_messages(body: dict) -> list[dict]:
    """The conversation as transformers' docs write it: arguments as dicts, text parts
    joined, a missing content as an empty string."""
    out = []
    for m in copy.deepcopy(body["messages"]):
        if isinstance(m.get("content"), list):
            m["content"] = "".join(p["text"] for p in m["content"])
        if m.get("content") is None:
            m["content"] = ""
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        out.append(m)
    return out


HF = textwrap.dedent("""
    import json, sys
    from transformers import AutoTokenizer
    cases = json.loads(open(sys.argv[1]).read())
    res = {}
    for key, (d, msgs, tools) in cases.items():
        tok = AutoTokenizer.from_pretrained(d)
        out = tok.apply_chat_template(msgs, tools=tools, tokenize=True,
                                      add_generation_prompt=True, return_dict=False)
        res[key] = list(out["input_ids"] if hasattr(out, "keys") else out)
    open(sys.argv[2], "w").write(json.dumps(res))
""")


@pytest.fixture(scope="module")
def reference(real_tokenizer_dirs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf-tools")
    cases = {f"{fam}|{name}": (str(real_tokenizer_dirs[fam]), hf_messages(body), body["tools"])
             for name, (fams, body) in CASES.items() for fam in fams}
    (tmp / "in.json").write_text(json.dumps(cases))
    subprocess.run([sys.executable, "-c", HF, str(tmp / "in.json"), str(tmp / "out.json")],
                   check=True, timeout=300)
    return json.loads((tmp / "out.json").read_text())


def job(tok: Tokenizer, body: dict):
    return parse("chat", body, tokenizer=tok, vocab_size=tok.vocab_size, max_context=1 << 16)


@pytest.mark.parametrize("family", ["qwen3", "llama3.1"])
def test_prompt_ids_with_tools_equal_transformers(family, real_tokenizer_dirs, reference):
    tok = Tokenizer.load(real_tokenizer_dirs[family])
    checked = 0
    for name, (fams, body) in CASES.items():
        if family not in fams:
            continue
        j = job(tok, body)
        assert j.prompts[0] == reference[f"{family}|{name}"], name
        assert (j.tools.parser is None) == (body.get("tool_choice") == "none")
        checked += 1
    assert checked >= 5
    # the tools are in the prompt: without them it is another (shorter) prompt
    plain = job(tok, {"messages": [ASK]}).prompts[0]
    assert len(plain) < len(reference[f"{family}|one tool"])


def test_llama31_refuses_parallel_calls_in_history_as_transformers_does(real_tokenizer_dirs):
    tok = Tokenizer.load(real_tokenizer_dirs["llama3.1"])
    with pytest.raises(Exception, match="single tool-calls"):
        job(tok, CASES["parallel calls and results"][1])
    plan = job(tok, {"messages": [ASK], "tools": [WEATHER], "parallel_tool_calls": True}).tools
    assert plan.parser.name == "llama3_json" and plan.limit == 1  # one call per reply


@pytest.mark.parametrize(("change", "param"), [
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "array"}}}]}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "required": "a"}}}]}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "params": {}}}]},
     "tools[0].function.params"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "add"}}},
     "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"messages": [ASK, {"role": "tool", "content": "5"}]}, "messages[1].tool_call_id"),
    ({"messages": [ASK, {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"messages": [ASK, {"role": "assistant", "tool_calls": []}]}, "messages[1].tool_calls"),
    ({"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]},
     "messages[0].tool_call_id"),
])
def test_bad_tools_and_tool_messages_are_400_naming_the_field(real_tokenizer_dirs, change,
                                                              param):
    tok = Tokenizer.load(real_tokenizer_dirs["qwen3"])
    with pytest.raises(APIError) as e:
        job(tok, {"messages": [ASK], **change})
    assert e.value.status == 400 and e.value.param == param, e.value.message


def test_a_template_without_tools_gets_the_generic_format(real_tokenizer_dirs):
    """Llama 3's template shows no tools: they are described in a system message, the
    earlier call and its result rewritten as text the template renders, and the reply held
    to the generic JSON format by a grammar; a --tool-call-parser for it stays a 400."""
    import json

    tok = Tokenizer.load(real_tokenizer_dirs["llama3"])  # Llama 3's template: no tools
    j = job(tok, {"messages": [ASK, CALLED, RESULT], "tools": [WEATHER, ADD]})
    assert j.tools.generic and j.tools.parser.name == "generic" and j.constrained_by == "tools"
    prompt = tok.decode(j.prompts[0])
    assert '"name": "get_weather"' in prompt and '{"response": TEXT}' in prompt
    assert '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"' in prompt
    assert 'get_weather returned: {"temperature": 21}' in prompt
    def schema_of(job_):
        s = job_.params[0].structured_outputs.json
        return json.loads(s) if isinstance(s, str) else s

    schema = schema_of(j)
    assert len(schema["anyOf"]) == 3  # two functions and the answer
    named = job(tok, {"messages": [ASK], "tools": [WEATHER, ADD],
                      "tool_choice": {"type": "function", "function": {"name": "add"}}})
    s = schema_of(named)
    assert s["properties"]["tool_call"]["properties"]["name"] == {"const": "add"}
    assert "Reply with one JSON object calling add" in tok.decode(named.prompts[0])
    none = job(tok, {"messages": [ASK], "tools": [WEATHER], "tool_choice": "none"})
    assert none.params[0].structured_outputs is None and "tool_call" not in tok.decode(
        none.prompts[0])
    with pytest.raises(APIError, match="does not render tools, so --tool-call-parser hermes"):
        parse("chat", {"messages": [ASK], "tools": [WEATHER]}, tokenizer=tok,
              vocab_size=tok.vocab_size, max_context=1 << 16, tool_parser="hermes")
    with pytest.raises(APIError) as e:
        job(tok, {"messages": [ASK], "tools": [WEATHER],
                  "response_format": {"type": "json_object"}})
    assert e.value.param == "response_format"
    assert job(tok, {"messages": [ASK], "tools": [], "tool_choice": "none"}).tools is None
    assert json.loads(json.dumps(schema))  # plain JSON, as the grammar engine takes it
