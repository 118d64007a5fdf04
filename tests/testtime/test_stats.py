import math

import pytest

from envace.experiments.stats import bootstrap_ci, paired_bootstrap_diff


def test_bootstrap_is_deterministic_and_contains_the_mean():
    xs = [1, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    a = bootstrap_ci(xs, seed=3)
    assert a == bootstrap_ci(xs, seed=3)
    mean, lo, hi = a
    assert mean == 0.6 and lo <= mean <= hi and 0.0 <= lo < hi <= 1.0


def test_more_tasks_give_a_narrower_interval():
    few = [1, 0] * 5
    many = [1, 0] * 100
    _, lo1, hi1 = bootstrap_ci(few)
    _, lo2, hi2 = bootstrap_ci(many)
    assert hi2 - lo2 < (hi1 - lo1) / 2
    assert lo2 < 0.5 < hi2


def test_degenerate_inputs():
    assert bootstrap_ci([1, 1, 1]) == (1.0, 1.0, 1.0)
    assert all(math.isnan(v) for v in bootstrap_ci([]))
    with pytest.raises(ValueError):
        bootstrap_ci([1], level=1.5)


def test_paired_difference():
    a = [1, 1, 1, 0, 1, 1, 0, 1]
    b = [0, 1, 0, 0, 1, 0, 0, 1]
    d, lo, hi = paired_bootstrap_diff(a, b)
    assert d == pytest.approx(0.375) and lo <= d <= hi
    with pytest.raises(ValueError):
        paired_bootstrap_diff([1], [1, 0])


def test_paired_gain_by_hand():
    from envace.experiments.stats import paired_gain

    # gains 1, 0, -0.5 on the three shared tasks ("d" has no "after"): mean 1/6, sample sd
    # sqrt(((5/6)^2 + (1/6)^2 + (2/3)^2) / 2) = sqrt(7/12), s.e. sqrt(7/12) / sqrt(3)
    before = {"a": 0.0, "b": 0.5, "c": 1.0, "d": 1.0}
    after = {"a": 1.0, "b": 0.5, "c": 0.5}
    mean, se, n = paired_gain(before, after)
    assert n == 3 and mean == pytest.approx(1 / 6) and se == pytest.approx(math.sqrt(7 / 12) / math.sqrt(3))
    assert paired_gain({"a": 0.0}, {"a": 1.0})[:1] == (1.0,) and math.isnan(paired_gain({"a": 0.0}, {"a": 1.0})[1])
    assert paired_gain({}, {"a": 1.0})[2] == 0
