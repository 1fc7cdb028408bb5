"""Incremental text with stop strings spanning token boundaries."""

from __future__ import annotations

import pytest

from astrai.infer.text_stream import TextStream


class CharDecoder:
    """Token i is the i-th string of a table (multi-character pieces)."""

    def __init__(self, pieces):
        self.pieces = pieces

    def push(self, i):
        return self.pieces[i]

    def flush(self):
        return ""


PIECES = ["Hel", "lo ", "wor", "ld", "\n", "##", "#", "END", "E", "ND", "x"]


def run(tokens, stop, include=False):
    ts = TextStream(CharDecoder(PIECES), stop, include)
    deltas = []
    for t in tokens:
        d, hit = ts.push(t)
        deltas.append(d)
        if hit:
            return "".join(deltas), hit, ts.text
    d, hit = ts.finish()
    deltas.append(d)
    return "".join(deltas), hit, ts.text


def test_no_stop_strings_stream_everything():
    assert run([0, 1, 2, 3], []) == ("Hello world", None, "Hello world")


@pytest.mark.parametrize("tokens,stop,expect", [
    ([0, 1, 2, 3], ["lo wo"], "Hel"),  # spans three tokens
    ([0, 1, 8, 9, 10], ["END"], "Hello "),  # "E" + "ND"
    ([5, 6, 0], ["###"], ""),  # "##" + "#"
    ([0, 4, 1], ["\n"], "Hel"),
    ([0, 1, 8, 10], ["END"], None),  # a false start "E" is released later
])
def test_stop_strings_across_tokens(tokens, stop, expect):
    text, hit, total = run(tokens, stop)
    if expect is None:
        assert hit is None and text == "Hello Ex" == total
    else:
        assert hit == stop[0] and text == expect == total


def test_earliest_stop_wins_and_include_option():
    text, hit, _ = run([0, 1, 2, 3], ["world", "lo"])
    assert (text, hit) == ("Hel", "lo")
    text, hit, _ = run([0, 1, 2, 3], ["wor"], include=True)
    assert (text, hit) == ("Hello wor", "wor")


def test_held_text_is_not_released_early():
    ts = TextStream(CharDecoder(PIECES), ["END"])
    assert ts.push(0) == ("Hel", None)
    assert ts.push(8) == ("", None)  # "E" might start "END"
    assert ts.push(9) == ("", "END")


def _naive(pieces, stop, include):
    """The text searched anew after each token: the first token that completes a stop
    string ends it, at that string's earliest start (the first listed one on a tie)."""
    for end in range(1, len(pieces) + 1):
        text = "".join(pieces[:end])
        hits = [(text.find(s), k, s) for k, s in enumerate(stop) if s in text]
        if hits:
            i, _, s = min(hits)
            return text[: i + len(s)] if include else text[:i], s
    return "".join(pieces), None


def test_incremental_equals_searching_the_whole_text_after_each_token():
    import random

    rng = random.Random(0)
    alphabet = "ab\n"
    for _ in range(400):
        pieces = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 3)))
                  for _ in range(rng.randint(1, 12))]
        stop = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 5)))
                for _ in range(rng.randint(1, 4))]
        include = rng.random() < 0.5
        ts = TextStream(CharDecoder(pieces), stop, include)
        out, hit = [], None
        for t in range(len(pieces)):
            d, hit = ts.push(t)
            out.append(d)
            if hit:
                break
        if hit is None:
            d, hit = ts.finish()
            out.append(d)
        assert ("".join(out), hit) == _naive(pieces, stop, include), (pieces, stop)
