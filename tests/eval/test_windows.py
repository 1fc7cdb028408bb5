"""Rolling windows equal lm-evaluation-harness's own utilities."""

import pytest

from astrai.eval.windows import rolling_windows

lm_utils = pytest.importorskip("lm_eval.utils")


@pytest.mark.parametrize("n", [0, 1, 5, 16, 17, 40, 100])
@pytest.mark.parametrize("max_len", [1, 4, 16])
def test_windows_equal_lm_eval(n, max_len):
    tokens = list(range(100, 100 + n))
    ours = list(rolling_windows(tokens, 7, max_len))
    theirs = [lm_utils.make_disjoint_window(w) for w in
              lm_utils.get_rolling_token_windows(tokens, prefix_token=7, max_seq_len=max_len,
                                                 context_len=1)]
    assert ours == [(list(a), list(b)) for a, b in theirs]
    # every token is predicted exactly once, in order, and each window fits the context
    assert [t for _, cont in ours for t in cont] == tokens
    assert all(len(c) + len(x) - 1 <= max_len for c, x in ours)


def test_bad_max_len():
    with pytest.raises(ValueError):
        list(rolling_windows([1, 2], 0, 0))
