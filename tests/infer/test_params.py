"""SamplingParams are checked once, completely, when built: every field's type, range and
size, with an error naming the field; afterwards they cannot change."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from astrai.errors import AstraiError, ConfigError
from astrai.infer.params import SamplingParams

BAD = [
    ("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2), ("min_p", 1.1),
    ("max_tokens", 0), ("repetition_penalty", 0.0), ("frequency_penalty", 3.0),
    ("stop", [""]), ("top_logprobs", 21),
    # values that passed a range check and then failed inside every engine step
    ("top_logprobs", 2.5), ("top_k", 2**70), ("top_k", 2**31), ("seed", 2**70),
    ("stop_token_ids", [2**40]), ("stop_token_ids", [-1]),
    # wrong types: bools are not integers, strings are not numbers, nan/inf are not finite
    ("max_tokens", True), ("max_tokens", 2.0), ("top_k", 1.0), ("temperature", "0.5"),
    ("temperature", math.nan), ("temperature", math.inf), ("top_p", math.nan),
    ("repetition_penalty", math.inf), ("presence_penalty", None), ("seed", "7"),
    ("seed", True), ("stop", None), ("stop", [3]), ("stop_token_ids", [True]),
    ("stop_token_ids", 5), ("logprobs", 1), ("ignore_eos", "yes"),
    ("include_stop_str_in_output", None),
    # sizes: every stop string costs a search after each token
    ("stop", ["x"] * 17), ("stop", ["x" * 257]), ("stop_token_ids", [1] * 17),
    ("stop", [f"s{i}" for i in range(100_000)]),
]


@pytest.mark.parametrize("field,value", BAD)
def test_invalid_values_are_refused_when_built_naming_the_field(field, value):
    with pytest.raises(ConfigError) as info:
        SamplingParams(**{field: value})
    msg = str(info.value)
    assert isinstance(info.value, AstraiError) and msg.startswith(f"sampling {field}=")
    assert "\n" not in msg and len(msg) < 200  # one line, even for 2**70


def test_valid_values_including_numpy_scalars():
    p = SamplingParams(max_tokens=np.int64(5), temperature=np.float32(0.7), top_k=-1,
                       top_p=1, seed=2**64 - 1, stop="END", stop_token_ids=(np.int32(3),),
                       top_logprobs=20, min_p=0, frequency_penalty=-2)
    assert p.stop == ["END"] and p.stop_token_ids == [3] and p.seed == 2**64 - 1
    assert SamplingParams(seed=-(2**63)).seed == -(2**63)
    most = SamplingParams(stop=["x" * 256] * 16, stop_token_ids=list(range(16)))
    assert len(most.stop) == 16 and len(most.stop_token_ids) == 16


def test_frozen_and_replace_checks_again():
    stops = ["a"]
    p = SamplingParams(stop=stops)
    stops.append("")  # the caller's list changing later does not reach the params
    assert p.stop == ["a"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.top_k = 2**70  # type: ignore[misc]
    assert dataclasses.replace(p, top_k=5).top_k == 5
    with pytest.raises(ConfigError, match="top_k"):
        dataclasses.replace(p, top_k=2**70)
