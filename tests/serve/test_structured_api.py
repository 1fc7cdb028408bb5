"""Structured outputs through a real `astrai serve` with the official openai client, on a
random-weight model with Qwen3's tokenizer: only the grammar can make its output valid, so
20 JSON schemas (nested objects, arrays, enums, bounded numbers, required and optional
properties; strings and arrays bounded so outputs close within max_tokens) all parsing and
validating (jsonschema), streamed and not, is the grammar's doing. Also pydantic's
`chat.completions.parse`, regex / choice / grammar through vLLM's `structured_outputs`,
n > 1, logprobs after the mask, completions, and the 400s."""

from __future__ import annotations

import json
import math
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.real_tokenizers import tiny_hf_model
from tests.serve.conftest import API_KEY, ServeProcess

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pydantic = pytest.importorskip("pydantic")
pytest.importorskip("llguidance")
pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

S = {"type": "string", "maxLength": 8}
I = {"type": "integer", "minimum": -50, "maximum": 50}  # noqa: E741


def obj(props: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": props,
            "required": list(props) if required is None else required,
            "additionalProperties": False}


SCHEMAS = [
    obj({"name": S}),
    obj({"age": I}),
    obj({"ok": {"type": "boolean"}}),
    obj({"color": {"enum": ["red", "green", "blue"]}}),
    obj({"x": {"type": "number", "minimum": 0, "maximum": 1}}),
    obj({"score": {"type": "number", "exclusiveMinimum": -1, "exclusiveMaximum": 1}}),
    obj({"tags": {"type": "array", "items": S, "maxItems": 3}}),
    obj({"ids": {"type": "array", "items": I, "minItems": 1, "maxItems": 4}}),
    obj({"user": obj({"name": S, "age": I})}),
    obj({"a": obj({"b": obj({"c": {"type": "boolean"}})})}),
    obj({"name": S, "nick": S}, required=["name"]),
    obj({"p": I, "q": I, "r": I}, required=[]),
    obj({"items": {"type": "array", "items": obj({"k": S, "v": I}), "maxItems": 2}}),
    obj({"mode": {"const": "fast"}, "level": I}),
    obj({"v": {"anyOf": [I, {"type": "null"}]}}),
    obj({"kind": {"enum": [1, 2, "three", None]}}),
    obj({"point": {"type": "array", "prefixItems": [I, I], "items": False, "minItems": 2}}),
    obj({"code": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"}}),
    obj({"n": {"type": "integer", "minimum": 1000, "maximum": 1009}, "s": S,
         "e": {"enum": ["x", "y"]}}, required=["n"]),
    {"type": "array", "items": obj({"id": I}), "minItems": 1, "maxItems": 3},
]
MSGS = [{"role": "user", "content": "Give me the data."}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("structured")
    model = tiny_hf_model("qwen3", root)
    srv = ServeProcess([str(model), "--api-key", API_KEY, "--served-model-name", "tiny",
                        "--max-kv-tokens", "16384", "--max-running", "16"], root / "err.txt")
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key=API_KEY, max_retries=0,
                        timeout=120)
    srv.stop()


def fmt(i: int) -> dict:
    return {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": SCHEMAS[i],
                                                    "strict": True}}


def one(client, i: int, stream: bool) -> tuple[str, str]:
    kw = dict(model="tiny", messages=MSGS, response_format=fmt(i), max_tokens=200,
              temperature=1.0, seed=i)
    if not stream:
        c = client.chat.completions.create(**kw).choices[0]
        return c.message.content, c.finish_reason
    text, finish = "", None
    for ch in client.chat.completions.create(stream=True, **kw):
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
    return text, finish


def test_twenty_schemas_parse_and_validate_streamed_and_not(client):
    """40 requests at once: constrained rows share the engine's batches."""
    jobs = [(i, s) for i in range(len(SCHEMAS)) for s in (False, True)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda j: one(client, *j), jobs))
    for (i, stream), (text, finish) in zip(jobs, results):
        assert finish == "stop", (i, stream, text)
        jsonschema.validate(json.loads(text), SCHEMAS[i])
    by = dict(zip(jobs, results))
    assert all(by[(i, False)][0] == by[(i, True)][0] for i in range(len(SCHEMAS)))


class Item(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)
    qty: int = pydantic.Field(ge=0, le=99)
    tags: list[str] = pydantic.Field(max_length=2)


def test_pydantic_parse(client):
    r = client.chat.completions.parse(model="tiny", messages=MSGS, response_format=Item,
                                      max_tokens=200, temperature=1.0, seed=3)
    item = r.choices[0].message.parsed
    assert isinstance(item, Item) and 0 <= item.qty <= 99


@pytest.mark.parametrize("so,check", [
    ({"regex": r"[a-z]{3,6}@[a-z]{2,4}\.com"},
     lambda t: re.fullmatch(r"[a-z]{3,6}@[a-z]{2,4}\.com", t)),
    ({"choice": ["alpha", "beta", "gamma delta"]},
     lambda t: t in ("alpha", "beta", "gamma delta")),
    ({"grammar": 'start: "(" num ("+" num)* ")"\nnum: /[0-9]/\n'},
     lambda t: re.fullmatch(r"\(\d(\+\d)*\)", t)),
])
def test_regex_choice_and_grammar_on_chat_and_completions(client, so, check):
    c = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=60,
                                       temperature=1.0, seed=5,
                                       extra_body={"structured_outputs": so}).choices[0]
    assert c.finish_reason == "stop" and check(c.message.content), c.message.content
    d = client.completions.create(model="tiny", prompt="Say:", max_tokens=60, seed=6,
                                  temperature=0.0, extra_body={"structured_outputs": so})
    assert d.choices[0].finish_reason == "stop" and check(d.choices[0].text)


def test_n_choices_and_logprobs_after_the_mask(client):
    r = client.chat.completions.create(model="tiny", messages=MSGS, n=3, max_tokens=200,
                                       temperature=1.0, seed=11, response_format=fmt(8),
                                       logprobs=True, top_logprobs=3)
    assert len(r.choices) == 3
    for c in r.choices:
        jsonschema.validate(json.loads(c.message.content), SCHEMAS[8])
        for t in c.logprobs.content:  # the chosen token is allowed: finite; masked: -9999
            assert -9999.0 < t.logprob <= 0.0
            tops = [a.logprob for a in t.top_logprobs]
            assert tops == sorted(tops, reverse=True) and tops[0] >= t.logprob
            assert sum(math.exp(x) for x in tops) <= 1.0 + 1e-4


def test_json_object(client):
    r = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=120,
                                       temperature=1.0, seed=2,
                                       response_format={"type": "json_object"})
    c = r.choices[0]
    if c.finish_reason == "stop":  # an unbounded object may run to max_tokens
        assert isinstance(json.loads(c.message.content), dict)
    assert c.message.content.startswith("{")


@pytest.mark.parametrize("body,needle", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "dependentRequired": {"a": ["b"]}}}}},
     "dependentRequired"),
    ({"structured_outputs": {"regex": "[a-z"}}, "unclosed character class"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "exactly one"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "whitespace_pattern"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "name"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
     "not both"),
    ({"structured_outputs": {"regex": "a" * 70000}}, "at most 65536"),  # bounded work
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": False}}}, "must be a JSON Schema object, got false"),
    # compiles, but its language is empty: refused at admission, not a 200 "error"
    ({"structured_outputs": {"regex": "[^\\x00-\\x{10FFFF}]"}}, "no output can satisfy it"),
])
def test_bad_constraints_are_400s_naming_the_problem(client, body, needle):
    with pytest.raises(openai.BadRequestError, match=needle) as e:
        client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=8,
                                       extra_body=body)
    assert e.value.status_code == 400
    assert "\n" not in e.value.body["message"] and len(e.value.body["message"]) < 400
    # the server goes on serving
    ok = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2)
    assert ok.choices[0].finish_reason == "length"


HOSTILE = "a{1000}{300}x"
"""14 characters whose token masks cost llguidance ~0.5 s of CPU each (its lexer is built
lazily, inside the mask): n=64 copies once stalled every client ~28 s."""
TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "string", "pattern": f"^{HOSTILE}$"}},
    "required": ["x"], "additionalProperties": False}}}


def victim(client, n: int) -> float:
    """Seconds a small free request of `n` tokens takes (beside a hostile one)."""
    t = time.monotonic()
    out = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=n,
                                         extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == n
    return time.monotonic() - t


@pytest.mark.parametrize("body,param", [
    ({"structured_outputs": {"regex": HOSTILE}}, "structured_outputs"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "string", "pattern": f"^{HOSTILE}$"}}}}, "response_format"),
    ({"structured_outputs": {"grammar": f'start: "say " /{HOSTILE}/\n'}},
     "structured_outputs"),
    ({"tools": [TOOL], "tool_choice": "required"}, "tools[0].function.parameters"),
])
def test_a_costly_constraint_is_a_400_and_others_are_not_stalled(client, body, param):
    """The hostile constraint, n=64, beside a small free request: the first is refused
    (its masks are timed when it compiles, off the engine's step) and the second answers
    within seconds."""
    with ThreadPoolExecutor(2) as pool:
        hostile = pool.submit(client.chat.completions.create, model="tiny", messages=MSGS,
                              max_tokens=32, n=64, extra_body=body)
        waited = pool.submit(victim, client, 16).result(timeout=120)
        assert waited < 5.0, f"a free request waited {waited:.1f} s beside the constraint"
        with pytest.raises(openai.BadRequestError, match="grammar") as e:
            hostile.result(timeout=120)
    assert e.value.status_code == 400 and e.value.body["param"] == param


WIDE = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(1000)}}
OPTIONAL_600 = {"type": "object", "properties": {f"o{i}": {"type": "string"} for i in range(600)}}
NESTED_600 = {"type": "object", "properties": {"inner": OPTIONAL_600}, "required": ["inner"]}
ALL_OF_ANY_OF = {"allOf": [{"anyOf": [obj({f"a{i}{j}": {"type": "string"}}) for j in range(8)]}
                           for i in range(6)]}


@pytest.mark.parametrize("schema", [OPTIONAL_600, WIDE, NESTED_600, ALL_OF_ANY_OF],
                         ids=["600-optional", "1000-properties", "nested-600", "allOf-x-anyOf"])
def test_a_schema_the_grammar_engine_cannot_follow_is_a_400(client, schema):
    """Schemas that compile but outgrow llguidance's limits once decoding starts (its Earley
    rows, its schema size) are refused when the request arrives, naming the field and the
    reason in one line — not answered with 200, empty content and finish "error" — while a
    free request beside them answers."""
    body = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    with ThreadPoolExecutor(2) as pool:
        hostile = pool.submit(client.chat.completions.create, model="tiny", messages=MSGS,
                              max_tokens=64, response_format=body)
        assert pool.submit(victim, client, 8).result(timeout=120) < 5.0
        with pytest.raises(openai.BadRequestError) as e:
            hostile.result(timeout=120)
    err = e.value.body
    assert e.value.status_code == 400 and err["param"] == "response_format"
    assert "\n" not in err["message"] and len(err["message"]) < 400


def test_a_tool_schema_the_grammar_engine_cannot_follow_names_the_tool():
    """The same for a tool's parameters under tool_choice required, in every call format:
    the call grammar is refused, and the 400 names the tool whose schema is at fault."""
    import tempfile
    from pathlib import Path

    from astrai.data.testing import tiny_tokenizer
    from astrai.infer.params import StructuredOutputs
    from astrai.infer.structured import GrammarCompiler
    from astrai.serve.constraints import compile_constraints
    from astrai.serve.errors import APIError
    from astrai.serve.tool_grammar import tool_grammar
    from astrai.serve.tool_parsers import PARSERS
    from astrai.serve.tools import ToolPlan

    tok = tiny_tokenizer(Path(tempfile.mkdtemp()))
    grammars = GrammarCompiler(tok, tok.vocab_size)
    tools = [{"type": "function", "function": {"name": "ok", "parameters": obj({"x": I})}},
             {"type": "function", "function": {"name": "wide", "parameters": WIDE}}]
    for fmt in ("hermes", "llama3_json", "mistral"):
        plan = ToolPlan(tools, "required", None, False, PARSERS[fmt]())
        spec = StructuredOutputs(grammar=tool_grammar(plan, tok.token_to_id))
        with pytest.raises(APIError) as e:
            compile_constraints(grammars, [spec], "tools", tools)
        assert e.value.param == "tools[1].function.parameters", fmt
