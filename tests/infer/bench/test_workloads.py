"""Workloads and arrival processes: determinism, the lengths asked for, file errors."""

import itertools
import json
import math

import numpy as np
import pytest

from astrai.errors import ConfigError, DataError
from astrai.infer.bench.arrivals import arrival_offsets, parse_rate
from astrai.infer.bench.workloads import (
    jsonl_workload,
    parse_range,
    random_workload,
    shared_prefix_workload,
    token_pool,
    warmup_requests,
)

POOL = token_pool(100, exclude=[0, 1, 2])


def test_parse_range():
    assert parse_range("7", "--x") == (7, 7)
    assert parse_range("3:9", "--x") == (3, 9)
    assert parse_range(5, "--x") == (5, 5)
    for bad in ("0", "9:3", "a:b", "", "1:"):
        with pytest.raises(ConfigError, match="--x"):
            parse_range(bad, "--x")


def test_token_pool_excludes_special_ids():
    assert set(POOL.tolist()) == set(range(3, 100))
    with pytest.raises(ConfigError):
        token_pool(2, exclude=[0, 1])


def test_random_workload_lengths_and_determinism():
    a = random_workload(200, (5, 9), (2, 4), POOL, seed=3)
    assert a == random_workload(200, (5, 9), (2, 4), POOL, seed=3)
    assert a != random_workload(200, (5, 9), (2, 4), POOL, seed=4)
    assert {r.prompt_len for r in a} == set(range(5, 10))  # inclusive, every length drawn
    assert {r.output_len for r in a} == {2, 3, 4}
    assert all(t in set(POOL.tolist()) for r in a for t in r.prompt_ids)


def test_shared_prefix_groups_share_exactly_their_prefix():
    reqs = shared_prefix_workload(12, groups=3, prefix_len=20, input_len=(4, 6),
                                  output_len=(3, 3), pool=POOL, seed=1)
    assert reqs == shared_prefix_workload(12, 3, 20, (4, 6), (3, 3), POOL, seed=1)
    prefixes = {}
    for r in reqs:
        prefixes.setdefault(r.prompt_ids[:20], []).append(r)
        assert 24 <= r.prompt_len <= 26 and r.output_len == 3
    assert sorted(len(v) for v in prefixes.values()) == [4, 4, 4]
    # Shuffled: not simply group 0, 1, 2, 0, 1, 2, ...
    assert [r.source for r in reqs] != sorted(r.source for r in reqs)
    with pytest.raises(ConfigError, match="--prefix-groups"):
        shared_prefix_workload(4, 0, 20, (1, 1), (1, 1), POOL)


def test_warmup_prompts_differ_from_the_workload():
    w = warmup_requests(2, POOL, seed=0)
    r = random_workload(2, (16, 16), (8, 8), POOL, seed=0)
    assert len(w) == 2 and all(x.prompt_len == 16 for x in w)
    assert w[0].prompt_ids[:8] != r[0].prompt_ids[:8]


def write(tmp_path, lines):
    p = tmp_path / "prompts.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def encode(text):
    return [ord(c) % 50 + 3 for c in text]


def test_jsonl_workload(tmp_path):
    p = write(tmp_path, [
        json.dumps({"prompt": "hello", "output_len": 4}),
        "",
        json.dumps({"prompt_ids": [5, 6, 7], "max_tokens": 2}),
        json.dumps({"messages": [{"role": "user", "content": "hi"}]}),
        json.dumps({"prompt": "unused"}),
    ])
    reqs = jsonl_workload(p, 3, (9, 9), encode=encode, encode_chat=lambda m: [9, 9],
                          vocab_size=100)
    assert [r.prompt_ids for r in reqs] == [tuple(encode("hello")), (5, 6, 7), (9, 9)]
    assert [r.output_len for r in reqs] == [4, 2, 9]
    assert reqs[1].source == f"{p}:3"  # line numbers count the blank line
    assert len(jsonl_workload(p, None, (1, 1), encode=encode, encode_chat=lambda m: [9])) == 4


@pytest.mark.parametrize("line, why", [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"text": "x"}', "exactly one of"),
    ('{"prompt": "x", "prompt_ids": [1]}', "exactly one of"),
    ('{"prompt_ids": [1, "a"]}', "list of integer"),
    ('{"prompt_ids": []}', "is empty"),
    ('{"prompt_ids": [5, 500]}', "token id 500 is outside"),
    ('{"prompt": 3}', "must be a string"),
    ('{"prompt": "x", "output_len": 0}', "output_len"),
    ('{"prompt": "x", "output_len": 2.5}', "output_len"),
    ('{"messages": [{"role": "user"}]}', "'messages' must be"),
])
def test_jsonl_bad_line_names_file_and_line(tmp_path, line, why):
    p = write(tmp_path, [json.dumps({"prompt": "fine"}), "", line])
    with pytest.raises(DataError, match=rf"prompts\.jsonl:3: .*{why}"):
        jsonl_workload(p, None, (1, 1), encode=encode, encode_chat=lambda m: [3],
                       vocab_size=100)


def test_jsonl_text_without_tokenizer_and_other_file_errors(tmp_path):
    p = write(tmp_path, [json.dumps({"prompt": "x"})])
    with pytest.raises(DataError, match=r":1: a text prompt needs a tokenizer"):
        jsonl_workload(p, None, (1, 1))
    empty = write(tmp_path, ["", "  "])
    with pytest.raises(DataError, match="no prompts"):
        jsonl_workload(empty, None, (1, 1))
    with pytest.raises(DataError, match="random, shared-prefix"):
        jsonl_workload(tmp_path / "missing.jsonl", None, (1, 1))
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b'{"prompt_ids": [1]}\n\xff\xfe\n')
    with pytest.raises(DataError, match=r"bin\.jsonl:2: not UTF-8"):
        jsonl_workload(binary, None, (1, 1))


def test_arrivals_infinite_rate_sends_everything_at_once():
    assert arrival_offsets(4) == [0.0] * 4
    assert arrival_offsets(0, 5.0) == []


def test_poisson_arrivals_are_seeded_with_the_right_mean_gap():
    a = arrival_offsets(4001, rate=20.0, seed=7)
    assert a == arrival_offsets(4001, rate=20.0, seed=7)
    assert a != arrival_offsets(4001, rate=20.0, seed=8)
    assert a[0] == 0.0 and all(x <= y for x, y in itertools.pairwise(a))
    gaps = np.diff(a)
    assert gaps.mean() == pytest.approx(1 / 20, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.06)  # exponential: CV 1


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_burstiness_keeps_the_rate_and_sets_the_spread(burstiness):
    gaps = np.diff(arrival_offsets(8001, rate=10.0, burstiness=burstiness, seed=1))
    assert gaps.mean() == pytest.approx(0.1, rel=0.06)
    # Gamma(k, theta) has coefficient of variation 1 / sqrt(k).
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.06)


def test_rate_and_burstiness_validation():
    assert parse_rate("inf") == math.inf and parse_rate("2.5") == 2.5
    for bad in ("0", "-1", "fast"):
        with pytest.raises(ConfigError, match="--request-rate"):
            parse_rate(bad)
    with pytest.raises(ConfigError, match="--burstiness"):
        arrival_offsets(3, 1.0, burstiness=0.0)


def test_jsonl_workload_with_a_byte_order_mark(tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps({"prompt_ids": [5, 6]}).encode() + b"\n")
    reqs = jsonl_workload(p, None, (1, 1), encode=encode, encode_chat=lambda m: [9],
                          vocab_size=100)
    assert [r.prompt_ids for r in reqs] == [(5, 6)]
