"""Tool calling through a real `astrai serve` with the official openai client, on random-weight
models with Qwen3's template (hermes calls) and Llama 3.1's (JSON calls): with
`tool_choice="required"` or a named function only the grammar can make the output a call,
so every call parsing and its arguments validating (jsonschema) against the tool's schema,
streamed and not, is the grammar's doing; `auto` leaves the random text as content; a tool
loop's history (the client's own assistant message with tool_calls, then tool results)
is accepted and rendered as transformers renders it."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.real_tokenizers import tiny_hf_model
from tests.serve.conftest import API_KEY, ServeProcess
from tests.serve.test_tool_prompts import HF, hf_messages

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": -99, "maximum": 99},
        "b": {"type": "integer", "minimum": -99, "maximum": 99},
        "exact": {"type": "boolean"}},
        "required": ["a", "b"], "additionalProperties": False}}}
TAGS = {"type": "function", "function": {
    "name": "tag_items", "parameters": {"type": "object", "properties": {
        "items": {"type": "array", "maxItems": 3, "items": {
            "type": "object", "properties": {"id": {"type": "integer", "minimum": 0,
                                                     "maximum": 9},
                                              "label": {"enum": ["a", "b"]}},
            "required": ["id", "label"], "additionalProperties": False}}},
        "required": ["items"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD, TAGS]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MSGS = [{"role": "user", "content": "What is the weather in Paris? Also add 2 and 3."}]


@pytest.fixture(scope="module", params=["qwen3", "llama3.1"])
def family_client(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"tools-{request.param}")
    model = tiny_hf_model(request.param, root, context=4096)  # 3.1's tool prompt: ~1.6k
    srv = ServeProcess([str(model), "--api-key", API_KEY, "--served-model-name", "tiny",
                        "--max-kv-tokens", "8192", "--max-running", "8"], root / "stderr.txt")
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=API_KEY, max_retries=0,
                           timeout=120)
    yield request.param, client, model
    srv.stop()


def check_calls(calls, allowed: set[str]) -> list[tuple[str, dict]]:
    """Each call has an OpenAI id, an allowed name and arguments valid for its schema."""
    assert calls, "no tool call"
    out = []
    for c in calls:
        assert re.fullmatch(r"call_[0-9a-f]{24}", c.id) and c.type == "function"
        assert c.function.name in allowed
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, SCHEMAS[c.function.name])
        out.append((c.function.name, args))
    return out


def streamed(client, **kw):
    """(content, calls as (id, name, arguments), finish_reason) of a streamed request."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for d in ch.delta.tool_calls or []:
                c = calls.setdefault(d.index, {"id": None, "name": None, "args": ""})
                if d.id:
                    assert c["id"] is None, "a call announced twice"
                    c["id"], c["name"] = d.id, d.function.name
                c["args"] += d.function.arguments or ""
            finish = ch.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("choice", ["required", "add"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_required_and_named_calls_validate_streamed_and_not(family_client, choice,
                                                            temperature):
    family, client, _ = family_client
    tool_choice = choice if choice == "required" else {"type": "function",
                                                       "function": {"name": choice}}
    allowed = set(SCHEMAS) if choice == "required" else {choice}
    kw = dict(model="tiny", messages=MSGS, tools=TOOLS, tool_choice=tool_choice,
              max_tokens=160, temperature=temperature, seed=7, parallel_tool_calls=False)
    r = client.chat.completions.create(**kw)
    (c,) = r.choices
    assert c.finish_reason == "tool_calls", c
    assert c.message.content is None and len(c.message.tool_calls) == 1
    want = check_calls(c.message.tool_calls, allowed)
    content, calls, finish = streamed(client, **kw)
    assert content == "" and finish == "tool_calls"
    assert [(x["name"], json.loads(x["args"])) for x in calls] == want  # same seed, same call
    assert [x["args"] for x in calls] == [t.function.arguments for t in c.message.tool_calls]
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", x["id"]) for x in calls)


def test_n_choices_each_make_a_valid_call(family_client):
    _, client, _ = family_client
    r = client.chat.completions.create(model="tiny", messages=MSGS, tools=TOOLS, n=3,
                                       tool_choice="required", max_tokens=160,
                                       temperature=1.0, seed=3, parallel_tool_calls=False)
    assert len(r.choices) == 3
    for c in r.choices:
        assert c.finish_reason == "tool_calls"
        check_calls(c.message.tool_calls, set(SCHEMAS))


def test_parallel_calls_when_the_format_carries_them(family_client):
    family, client, _ = family_client
    r = client.chat.completions.create(model="tiny", messages=MSGS, tools=TOOLS,
                                       tool_choice="required", max_tokens=400,
                                       temperature=0.0, parallel_tool_calls=True)
    (c,) = r.choices
    # the random model may keep adding calls until max_tokens: the complete ones still parse
    assert c.finish_reason in ("tool_calls", "length")
    calls = check_calls(c.message.tool_calls, set(SCHEMAS))
    if family == "llama3.1":  # Llama 3.1's template carries one call per message
        assert len(calls) == 1 and c.finish_reason == "tool_calls"
    else:
        assert len(calls) >= 1 and (c.finish_reason == "tool_calls" or len(calls) > 1)


def test_auto_leaves_the_random_text_as_content(family_client):
    _, client, _ = family_client
    kw = dict(model="tiny", messages=MSGS, tools=TOOLS, max_tokens=24, temperature=0.0)
    r = client.chat.completions.create(**kw)
    (c,) = r.choices
    plain = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=24,
                                           temperature=0.0).choices[0]
    assert c.message.tool_calls is None and c.finish_reason in ("stop", "length")
    assert isinstance(c.message.content, str) and c.message.content
    assert r.usage.prompt_tokens > 0
    content, calls, finish = streamed(client, **kw)
    assert (content, calls, finish) == (c.message.content, [], c.finish_reason)
    r_none = client.chat.completions.create(tool_choice="none", **kw).choices[0]
    assert r_none.message.content == c.message.content  # same prompt, nothing parsed
    assert plain.message.content is not None


def test_a_tool_loop_round_trips_through_the_history(family_client, tmp_path):
    family, client, model = family_client
    messages = list(MSGS)
    first = client.chat.completions.create(
        model="tiny", messages=messages, tools=TOOLS, max_tokens=160, temperature=0.0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    msg = first.choices[0].message
    (call,) = msg.tool_calls
    messages.append(msg.model_dump(exclude_none=True))  # as the client gives it back
    messages.append({"role": "tool", "tool_call_id": call.id,
                     "content": json.dumps({"temperature": 21})})
    second = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS,
                                            max_tokens=8, temperature=0.0)
    assert second.choices[0].finish_reason in ("stop", "length")
    # the server rendered the history as transformers does: same prompt length
    (tmp_path / "in.json").write_text(json.dumps(
        {"loop": (str(model), hf_messages({"messages": messages}), TOOLS)}))
    subprocess.run([sys.executable, "-c", HF, str(tmp_path / "in.json"),
                    str(tmp_path / "out.json")], check=True, timeout=300)
    want = json.loads((tmp_path / "out.json").read_text())["loop"]
    assert second.usage.prompt_tokens == len(want)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_bad_tools_are_400s_in_openai_shape(family_client):
    _, client, _ = family_client
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=4, tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}])
    assert e.value.status_code == 400
    assert e.value.body["param"] == "tools[0].function.parameters"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=4, tools=TOOLS,
                                       tool_choice={"type": "function",
                                                    "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice"


def test_pydantic_schemas_with_refs_make_valid_calls(family_client):
    """pydantic's `model_json_schema()` keeps nested models in `$defs`; a required call
    of such a tool is enforced and its arguments validate (it was a 400 "Pointer
    '/$defs/Addr' does not exist")."""
    pydantic = pytest.importorskip("pydantic")

    class Addr(pydantic.BaseModel):  # closed objects: the random model must end them
        model_config = pydantic.ConfigDict(extra="forbid")
        city: str = pydantic.Field(max_length=8)
        zip: int = pydantic.Field(ge=0, le=99)

    class Person(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        name: str = pydantic.Field(max_length=6)
        home: Addr

    schema = Person.model_json_schema()
    _, client, _ = family_client
    r = client.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=120, tool_choice="required",
        tools=[{"type": "function", "function": {"name": "save", "parameters": schema}}])
    assert r.choices[0].message.tool_calls, r.choices[0].message.content
    call = r.choices[0].message.tool_calls[0]
    Person.model_validate_json(call.function.arguments)
    jsonschema.validate(json.loads(call.function.arguments), schema)


def test_a_refused_tool_schema_names_the_tool_in_one_line(family_client):
    _, client, _ = family_client
    bad = {"type": "function", "function": {"name": "g", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}},
        "dependentRequired": {"a": ["b"]}}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=8,
                                       tools=[WEATHER, bad], tool_choice="required")
    err = e.value.body
    assert err["param"] == "tools[1].function.parameters"
    assert "dependentRequired" in err["message"] and "\n" not in err["message"]
    assert "%json" not in err["message"] and len(err["message"]) < 400


def test_a_call_whose_closing_tag_max_tokens_cut_is_content(family_client):
    """docs/serve.md: a call cut off by max_tokens stays content (with finish "length"),
    also when only its closing tag is missing."""
    family, client, _ = family_client
    if family != "qwen3":  # llama3_json has no closing marker
        return
    now = {"type": "function", "function": {"name": "now"}}
    kw = {"model": "tiny", "messages": MSGS, "tools": [now], "tool_choice": "required",
          "parallel_tool_calls": False}
    whole = client.chat.completions.create(max_tokens=60, **kw)
    assert whole.choices[0].message.tool_calls and \
        whole.choices[0].finish_reason == "tool_calls"
    cut = client.chat.completions.create(max_tokens=whole.usage.completion_tokens - 1, **kw)
    c = cut.choices[0]
    assert c.finish_reason == "length" and not c.message.tool_calls
    assert c.message.content.startswith("<tool_call>") and '"now"' in c.message.content

