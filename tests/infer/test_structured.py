"""Structured outputs in the engine, against references: the bitmask unpacking against a
naive loop; each constrained greedy token against the argmax, over the tokens an
independent llguidance matcher allows, of the model's own logits (full recompute, no
cache); outputs that parse and validate; free requests beside constrained ones unchanged;
log-probabilities of the masked distribution; refusals naming what to fix."""

from __future__ import annotations

import json
import re

import pytest
import torch

from astrai.errors import ConfigError
from astrai.infer import Engine, SamplingParams
from astrai.infer.sampling_math import unpack_bitmask
from astrai.infer.structured import StructuredOutputs, grammar_text
from tests.real_tokenizers import tiny_hf_model

llg = pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 999},
    "tag": {"enum": ["a", "b", "c"]},
    "name": {"type": "string", "maxLength": 6},
    "xs": {"type": "array", "items": {"type": "integer", "minimum": -1, "maximum": 1},
           "maxItems": 3}},
    "required": ["id", "tag", "name"], "additionalProperties": False}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_hf_model("qwen3", tmp_path_factory.mktemp("so"))


@pytest.fixture(scope="module")
def engine(model_dir):
    return Engine.from_checkpoint(model_dir, device="cpu")


def test_unpack_bitmask_equals_a_loop():
    g = torch.Generator().manual_seed(0)
    mask = torch.randint(-2**31, 2**31 - 1, (3, 4), dtype=torch.int32, generator=g)
    V = 100
    want = torch.tensor([[bool((int(mask[b, t // 32]) >> (t % 32)) & 1) for t in range(V)]
                         for b in range(3)])
    assert torch.equal(unpack_bitmask(mask, V), want)


def _allowed(matcher, V):
    bm = torch.zeros(1, (V + 31) // 32, dtype=torch.int32)
    matcher.unsafe_compute_mask_ptr(bm[0].data_ptr(), bm.shape[1] * 4)
    return unpack_bitmask(bm, V)[0]


def test_greedy_constrained_tokens_are_the_masked_argmax_of_hf(engine, model_dir):
    import transformers
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    spec = StructuredOutputs(json=SCHEMA)
    prompt = engine.tokenizer.encode("Describe an item:")
    (out,) = engine.generate([prompt], SamplingParams.greedy(60, structured_outputs=spec))
    V = hf.config.vocab_size
    tok = engine.grammars.lltokenizer()
    m = llg.LLMatcher(tok, grammar_text(spec))
    ids = list(prompt)
    for t in out.token_ids:  # an independent matcher and a full forward per position
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1].float()
        allowed = _allowed(m, V)
        assert t == int(logits.masked_fill(~allowed, float("-inf")).argmax())
        assert m.consume_token(t)
        ids.append(t)
    assert out.finish_reason == "stop"
    jsonschema.validate(json.loads(out.text), SCHEMA)


def test_every_kind_parses_sampled_and_batched_with_free_requests(engine):
    specs = [StructuredOutputs(json=SCHEMA), StructuredOutputs(regex=r"[a-z]{2,6}-\d{3}"),
             StructuredOutputs(choice=["red", "green", "blue"]),
             StructuredOutputs(grammar='start: "x" ("," "x"){0,4}\n'),
             StructuredOutputs(json_object=True)]
    prompts = ["Tell me:", "Hello", "Once upon"]
    params = [SamplingParams(max_tokens=80, temperature=1.0, seed=s, structured_outputs=sp)
              for s, sp in enumerate(specs)]
    free = SamplingParams(max_tokens=12, temperature=1.0, seed=99)
    outs = engine.generate([prompts[i % 3] for i in range(6)], params + [free])
    alone = engine.generate([prompts[5 % 3]], free)[0]
    assert outs[5].token_ids == alone.token_ids  # the masks touch their own rows only
    jsonschema.validate(json.loads(outs[0].text), SCHEMA)
    assert re.fullmatch(r"[a-z]{2,6}-\d{3}", outs[1].text)
    assert outs[2].text in ("red", "green", "blue")
    assert re.fullmatch(r"x(,x){0,4}", outs[3].text)
    if outs[4].finish_reason == "stop":  # an unbounded object may run to max_tokens
        assert isinstance(json.loads(outs[4].text), dict)
    assert all(o.finish_reason == "stop" for o in outs[:4])


def test_logprobs_are_the_masked_distributions(engine):
    """The first token's top-20 holds every token that can start "yes" or "no" (fewer than
    20 in this vocabulary), their probabilities summing to one; no other token has any."""
    spec = StructuredOutputs(choice=["yes", "no"])
    params = SamplingParams(max_tokens=4, temperature=1.0, seed=1, logprobs=True,
                            top_logprobs=20, structured_outputs=spec)
    deltas = list(engine.generate(["Answer:"], params, stream=True))
    first = deltas[0].delta_top_logprobs[0]
    live = {t: lp for t, lp in first.items() if lp > float("-inf")}
    assert sum(torch.tensor(list(live.values())).exp()) == pytest.approx(1.0, abs=1e-4)
    dec = engine.tokenizer
    assert all("yes".startswith(dec.decode([t])) or "no".startswith(dec.decode([t]))
               for t in live)
    assert "".join(d.delta_text for d in deltas) in ("yes", "no")
    assert deltas[-1].finish_reason == "stop"


@pytest.mark.parametrize("kw,needle", [
    ({"json": {"type": "object", "dependentRequired": {"a": ["b"]}}}, "dependentRequired"),
    ({"regex": "[a-z"}, "unclosed character class"),
    ({"grammar": "start: nosuchrule\n"}, "nosuchrule"),
])
def test_what_the_grammar_engine_refuses_names_it(engine, kw, needle):
    with pytest.raises(ConfigError, match=needle):
        engine.add_request("x", SamplingParams(structured_outputs=StructuredOutputs(**kw)))


@pytest.mark.parametrize("kw", [{}, {"regex": "a", "choice": ["a"]}, {"choice": []},
                                {"json": "{not json"}, {"regex": "a" * 70000}])
def test_bad_specs_are_config_errors(kw):
    with pytest.raises(ConfigError, match="structured outputs"):
        StructuredOutputs(**kw)


def test_boolean_schemas_are_named():
    for value, words in ((False, "got false"), (True, "got true")):
        with pytest.raises(ConfigError, match=words):
            StructuredOutputs(json=value)


def test_keys_come_in_the_schemas_property_order(engine):
    """OpenAI and vLLM write properties in the schema's order; the grammar forces it, so
    greedy decoding shows it whatever the weights. The reordered schema is another
    constraint, not a cache hit on the first."""
    props = {k: {"type": "integer", "minimum": 0, "maximum": 9} for k in ("z", "a", "m")}
    out = []
    for order in (("z", "a", "m"), ("m", "z", "a")):
        schema = {"type": "object", "properties": {k: props[k] for k in order},
                  "required": list(order), "additionalProperties": False}
        params = SamplingParams(max_tokens=40, temperature=0.0,
                                structured_outputs=StructuredOutputs(json=schema))
        out.append(engine.generate(["Tell me:"], params)[0].text)
    assert [list(json.loads(t)) for t in out] == [["z", "a", "m"], ["m", "z", "a"]]


def test_the_same_spec_compiles_once(engine):
    g = engine.grammars
    spec = StructuredOutputs(regex=r"\d{4}")
    a, b = g.compile(spec), g.compile(StructuredOutputs(regex=r"\d{4}"))
    assert a is not b and (spec.kind, spec.source) in g._cache


def test_constrained_rows_do_not_speculate_and_still_parse(model_dir):
    """With speculative decoding on, a constrained request decodes one token a step (its
    proposals would skip the grammar's masks) while a free, repetitive one speculates."""
    from astrai.infer.config import SpeculativeConfig
    eng = Engine.from_checkpoint(model_dir, device="cpu",
                                 speculative=SpeculativeConfig(method="ngram"))
    spec = StructuredOutputs(json=SCHEMA)
    (out,) = eng.generate(["Describe:"], SamplingParams.greedy(60, structured_outputs=spec))
    jsonschema.validate(json.loads(out.text), SCHEMA)
    assert eng.stats().spec_draft_tokens == 0
    eng.generate(["a b a b a b a b a b"], SamplingParams.greedy(24))  # the prompt repeats
    assert eng.stats().spec_draft_tokens > 0


def test_a_grammar_failing_mid_decode_is_one_line(engine):
    """llguidance's error carries a multi-kilobyte dump of its parser state; the request's
    error and the log keep one line of it (no traceback: the constraint, not a bug)."""
    from astrai.infer.structured import ConstraintError

    c = engine.grammars.constraint(StructuredOutputs(regex="ab"))
    bad = engine.tokenizer.encode("z")[-1]
    with pytest.raises(ConstraintError) as e:
        c.advance(bad)
    assert "\n" not in str(e.value) and len(str(e.value)) < 400
    assert not engine.grammars.constraint(StructuredOutputs(regex="ab")).matcher.is_error()


def test_an_empty_language_is_refused_when_compiled(engine):
    with pytest.raises(ConfigError, match="no output can satisfy it"):
        engine.grammars.compile(StructuredOutputs(regex=r"[^\x00-\x{10FFFF}]"))


def test_a_repeated_spec_is_served_from_the_cache(engine, monkeypatch):
    """Requests with the same constraint (equal specs, not the same object) compile it once;
    another constraint compiles anew. Counted at the compiler's one way into llguidance."""
    from astrai.infer import structured

    built = []
    real = structured.grammar_text
    monkeypatch.setattr(structured, "grammar_text", lambda spec: built.append(spec) or real(spec))
    params = [SamplingParams(max_tokens=2, structured_outputs=StructuredOutputs(regex=rx))
              for rx in [r"[0-9]{3}-cached"] * 3 + [r"[0-9]{4}-cached"]]
    outs = engine.generate(["x"] * 4, params)
    assert [b.regex for b in built] == [r"[0-9]{3}-cached", r"[0-9]{4}-cached"]
    assert all(re.fullmatch(r"[0-9]{1,2}", o.text) for o in outs)  # each walks its grammar


@pytest.mark.parametrize("kw", [{"regex": "a{1000}{300}x"},
                                {"json": {"type": "string", "pattern": "^a{1000}{300}x$"}},
                                {"grammar": 'start: "say " /a{1000}{300}x/\n'}])
def test_a_constraint_whose_masks_cost_too_much_is_refused(engine, kw):
    """llguidance builds its lexer inside the mask: the compiler times the first masks and
    refuses one over the budget (these take about 0.5 s of CPU each)."""
    with pytest.raises(ConfigError, match="grammar work"):
        engine.grammars.compile(StructuredOutputs(**kw))


def test_many_rows_of_one_constraint_share_one_budget(engine, monkeypatch):
    """n copies of a constraint cost n masks a step: refused when n x the measured mask
    exceeds the batch budget, accepted below it."""
    from astrai.infer import structured

    g, spec = engine.grammars, StructuredOutputs(regex=r"[a-z]{2,9}-rows")
    g.compile(spec)
    seconds = g._cache[(spec.kind, spec.source)][1]
    monkeypatch.setattr(structured, "BATCH_MASK_BUDGET", 10.5 * seconds)
    g.compile(spec, copies=10)
    with pytest.raises(ConfigError, match="11 rows"):
        g.compile(spec, copies=11)


def test_the_cache_is_bounded_by_bytes(engine, monkeypatch):
    """Entries are dropped (least recently used first) once their estimated bytes pass the
    bound, whatever their count; the total is the sum of what is kept."""
    from astrai.infer import grammar_cost, structured

    g = structured.GrammarCompiler(engine.grammars.tokenizer, engine.grammars.vocab_size)
    g._lltok = engine.grammars.lltokenizer()
    monkeypatch.setattr(structured, "CACHE_BYTES", 4 * grammar_cost.ENTRY_BYTES)
    specs = [StructuredOutputs(regex=f"[a-z]{{{i + 1}}}-bytes") for i in range(6)]
    for s in specs:
        g.compile(s)
    assert all(v[2] >= grammar_cost.ENTRY_BYTES for v in g._cache.values())
    assert 1 <= len(g._cache) <= 3 and list(g._cache)[-1] == (specs[-1].kind, specs[-1].source)
    assert g._bytes == sum(v[2] for v in g._cache.values()) <= structured.CACHE_BYTES
