"""fit_lengths: default benchmark lengths scaled to the model's context (closed forms)."""

from astrai.infer.bench.config import BenchConfig, fit_lengths


def test_defaults_scale_down_to_the_context():
    c = fit_lengths(BenchConfig("tiny"), 256)  # 256 + 128 > 256: scale 256/384
    assert (c.input_len, c.output_len) == ((42, 170), (21, 85))
    assert c.input_len[1] + c.output_len[1] <= 256


def test_defaults_kept_when_they_fit_or_the_context_is_unknown():
    for ctx in (None, 4096):
        c = fit_lengths(BenchConfig("tiny"), ctx)
        assert (c.input_len, c.output_len, c.prefix_len) == ((64, 256), (32, 128), 256)


def test_given_lengths_are_kept_and_the_rest_share_what_is_left():
    c = fit_lengths(BenchConfig("tiny", input_len=(4, 200)), 256)
    assert c.input_len == (4, 200) and c.output_len == (14, 56)  # 56 = 256 - 200
    c = fit_lengths(BenchConfig("tiny", workload="shared-prefix", prefix_len=64), 256)
    assert c.prefix_len == 64 and c.input_len[1] + c.output_len[1] <= 192
