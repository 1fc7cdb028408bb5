"""The grammar of a required / named tool call accepts exactly the model's own call syntax:
the call text its chat template writes for an assistant `tool_calls` message (Qwen3's
hermes blocks, Llama 3.1's JSON), tokenized as the model reads it; and refuses arguments
outside the function's schema, another function under a named choice, and JSON laid out
otherwise than the template writes it."""

from __future__ import annotations

import pytest

from astrai.data.tokenizer import Tokenizer
from astrai.serve.tool_grammar import tool_grammar
from astrai.serve.tools import read_tools

llguidance = pytest.importorskip("llguidance")
pytest.importorskip("llguidance.hf")
transformers = pytest.importorskip("transformers")

CITY = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"], "additionalProperties": False}}}
NOW = {"type": "function", "function": {"name": "now"}}  # no parameters
TOOLS = [CITY, ADD, NOW]
CALLS = [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": -2}), ("now", {})]
END = {"qwen3": "<|im_end|>", "llama3.1": "<|eot_id|>"}


def rendered_reply(hf, calls) -> str:
    """The assistant turn the template writes for `calls` (Qwen3's empty think block,
    which its template adds to the last turn, left out)."""
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}}
                           for n, a in calls]}]
    head = hf.apply_chat_template(msgs[:1], tools=TOOLS, tokenize=False,
                                  add_generation_prompt=True)
    full = hf.apply_chat_template(msgs, tools=TOOLS, tokenize=False)
    reply = full[len(head):].split("</think>\n\n")[-1]
    return reply[:reply.index(next(e for e in END.values() if e in reply))]


def accepts(env, grammar: str, hf, text: str) -> bool:
    m = llguidance.LLMatcher(env, llguidance.LLMatcher.grammar_from_lark(grammar),
                             log_level=0)
    ok = m.consume_tokens(hf.encode(text, add_special_tokens=False))
    return bool(ok) and m.is_accepting() and not m.get_error()


@pytest.fixture(scope="module", params=["qwen3", "llama3.1"])
def family(request, real_tokenizer_dirs):
    d = real_tokenizer_dirs[request.param]
    hf = transformers.AutoTokenizer.from_pretrained(d)
    tok = Tokenizer.load(d)
    added = {t.content: i for i, t in tok.backend.get_added_tokens_decoder().items()}
    return request.param, tok, hf, llguidance.hf.from_tokenizer(hf), added.get


def grammar_for(tok, token_id, **body):
    plan = read_tools({"tools": TOOLS, **body}, tok.chat_template, None)
    return tool_grammar(plan, token_id)


def test_each_function_call_as_the_template_writes_it_is_accepted(family):
    name, tok, hf, env, token_id = family
    g = grammar_for(tok, token_id, tool_choice="required", parallel_tool_calls=False)
    for call in CALLS:
        assert accepts(env, g, hf, rendered_reply(hf, [call])), call
    named = grammar_for(tok, token_id, tool_choice={"type": "function",
                                                    "function": {"name": "add"}})
    assert accepts(env, named, hf, rendered_reply(hf, [CALLS[1]]))
    assert not accepts(env, named, hf, rendered_reply(hf, [CALLS[0]]))


def test_parallel_calls_when_the_format_carries_them(family):
    name, tok, hf, env, token_id = family
    if name == "llama3.1":  # one call per reply: the template refuses two in the history
        assert "start: fn\n" in grammar_for(tok, token_id, tool_choice="required")
        return
    two = rendered_reply(hf, CALLS[:2])
    assert accepts(env, grammar_for(tok, token_id, tool_choice="required"), hf, two)
    assert not accepts(env, grammar_for(tok, token_id, tool_choice="required",
                                        parallel_tool_calls=False), hf, two)


def test_arguments_outside_the_schema_and_other_layouts_are_refused(family):
    name, tok, hf, env, token_id = family
    g = grammar_for(tok, token_id, tool_choice="required", parallel_tool_calls=False)
    good = rendered_reply(hf, [CALLS[1]])
    for bad in (good.replace("-2", '"x"'),           # a string for an integer
                good.replace(', "b": -2', ""),       # a required argument missing
                good.replace("-2}", '-2, "c": 3}'),  # an argument the schema does not have
                good.replace('"add"', '"sub"'),      # a function that is not in tools
                good.replace('": ', '":')):          # another JSON layout
        assert not accepts(env, g, hf, bad), bad


def test_pydantic_schemas_with_defs_and_refs_are_enforced(family):
    """pydantic's `model_json_schema()` puts nested models in `$defs` and refers to them
    by `#/$defs/...`; embedded in the call's schema those references still resolve, per
    function (two tools may each define their own `Addr`)."""
    pydantic = pytest.importorskip("pydantic")

    class Addr(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=8)
        zip: int

    class Person(pydantic.BaseModel):
        name: str
        home: Addr
        friends: list[Addr] = pydantic.Field(default_factory=list)

    class Addr2(pydantic.BaseModel):  # another function's "Addr": a different schema
        street: str
    Addr2.__name__ = "Addr"

    class Place(pydantic.BaseModel):
        where: Addr2

    _, tok, hf, env, token_id = family
    tools = [{"type": "function", "function": {"name": n, "parameters": m.model_json_schema()}}
             for n, m in (("save", Person), ("go", Place))]
    assert "$defs" in tools[0]["function"]["parameters"]
    plan = read_tools({"tools": tools, "tool_choice": "required",
                       "parallel_tool_calls": False}, tok.chat_template, None)
    g = tool_grammar(plan, token_id)
    person = {"name": "Al", "home": {"city": "Paris", "zip": 75}, "friends": []}
    good = rendered_reply(hf, [("save", person)])
    assert accepts(env, g, hf, good)
    assert accepts(env, g, hf, rendered_reply(hf, [("go", {"where": {"street": "Main"}})]))
    assert not accepts(env, g, hf, good.replace('"zip": 75', '"zip": "75"'))
    assert not accepts(env, g, hf, rendered_reply(hf, [("go", {"where": {"city": "Rome",
                                                                          "zip": 1}})]))
