"""grpolab.report.stats: the report's statistics against hand-computed values and scipy's own tests."""

from __future__ import annotations

import math

import numpy as np
import pytest

from grpolab.report import stats


def test_mean_se_by_hand():
    mean, se = stats.mean_se([0.3, 0.5])
    assert mean == pytest.approx(0.4) and se == pytest.approx(math.sqrt(0.02) / math.sqrt(2))  # sd 0.1414 / sqrt 2
    assert math.isnan(stats.mean_se([0.7])[1])  # one seed: no SE
    with pytest.raises(ValueError, match="values: expected a non-empty"):
        stats.mean_se([])
    with pytest.raises(ValueError, match="not finite"):
        stats.mean_se([0.1, float("nan")])


def test_paired_t_and_tost_by_hand_and_against_scipy():
    from scipy import stats as st

    # differences 1, 2, 3, 4: mean 2.5, sd sqrt(5/3), SE 0.6455, t = 3.873 on 3 df, p = 0.0305 (t table)
    t, df, p = stats.one_sample_t([1, 2, 3, 4])
    assert (round(t, 3), df, round(p, 4)) == (3.873, 3, 0.0305)
    a, b = [0.61, 0.55, 0.58, 0.66, 0.52], [0.50, 0.49, 0.57, 0.55, 0.51]
    paired = stats.compare(dict(enumerate(a)), dict(enumerate(b)), margin=0.02)
    ref = st.ttest_rel(a, b)
    assert paired.t == pytest.approx(ref.statistic) and paired.p == pytest.approx(ref.pvalue)
    assert paired.diff == pytest.approx(np.mean(np.subtract(a, b))) and paired.df == 4
    # TOST with margin 5 on 1..4: the upper one-sided test (H0 mean >= 5) has t = -3.873, p = 0.0305 / 2
    assert stats.tost([1, 2, 3, 4], 5) == pytest.approx(0.0305 / 2, abs=1e-4)
    # ... and it does not find equivalence when the mean is close to the margin: p >= 0.5 at mean == margin
    assert stats.tost([1, 2, 3, 4], 2.5) == pytest.approx(0.5)
    # TOST p < 0.05 exactly when the 90% t interval lies inside the margins
    d = np.array([0.01, -0.02, 0.005, 0.0, 0.012])
    half = st.t.ppf(0.95, 4) * d.std(ddof=1) / math.sqrt(5)
    for margin in (abs(d.mean()) + half * 0.99, abs(d.mean()) + half * 1.01):
        assert (stats.tost(d, margin) < 0.05) == (margin > abs(d.mean()) + half)
    with pytest.raises(ValueError, match="margin must be positive"):
        stats.tost(d, 0)


def test_constant_or_single_differences_give_nan_not_an_error():
    t, df, p = stats.one_sample_t([0.1, 0.1, 0.1])
    assert math.isnan(t) and math.isnan(p) and df == 2
    assert math.isnan(stats.tost([0.2], 0.05))


def test_bootstrap_by_hand():
    # two differences 0 and 1: resampled means are 0, 0.5, 1 with chances 1/4, 1/2, 1/4, so the 2.5% and 97.5%
    # quantiles of 10000 resamples are 0 and 1
    assert stats.bootstrap_ci([0.0, 1.0]) == (0.0, 1.0)
    assert stats.bootstrap_ci([0.3, 0.3, 0.3]) == pytest.approx((0.3, 0.3))
    lo, hi = stats.bootstrap_ci(np.linspace(-1, 1, 41), seed=1)
    se = np.linspace(-1, 1, 41).std(ddof=0) / math.sqrt(41)  # the bootstrap SE of a mean uses ddof 0
    assert lo == pytest.approx(-1.96 * se, abs=0.03) and hi == pytest.approx(1.96 * se, abs=0.03)
    assert stats.bootstrap_ci([0.0, 1.0, 3.0], seed=5) == stats.bootstrap_ci([0.0, 1.0, 3.0], seed=5)
    values = np.random.default_rng(3).normal(size=15)  # another pairing order, the same interval
    assert stats.bootstrap_ci(values) == stats.bootstrap_ci(values[::-1]) == stats.bootstrap_ci(np.sort(values))


def test_pairing_uses_common_seeds_only():
    paired = stats.compare({0: 0.5, 1: 0.7, 2: 0.9}, {0: 0.4, 1: 0.5, 3: 0.1})
    assert paired.seeds == [0, 1] and paired.diff == pytest.approx(0.15) and paired.tost_p is None
    with pytest.raises(ValueError, match="no seed in common"):
        stats.compare({0: 0.5}, {1: 0.4})


def test_below_ten_pairs_the_interval_is_the_t_interval_and_agrees_with_p():
    """Issue 39 (item 15): with two seeds the percentile interval was the range of the two differences,
    [-0.051, -0.008] beside p = 0.40; below 10 pairs the interval is scipy's t interval (df n-1), which excludes 0
    exactly when the paired t-test's p < 0.05."""
    from scipy import stats as st

    base = {0: 0.5, 1: 0.6}
    paired = stats.compare({0: 0.5 - 0.051, 1: 0.6 - 0.008}, base)
    d = np.array([-0.051, -0.008])
    assert paired.ci_method == "t" and paired.p == pytest.approx(0.40, abs=0.005)
    want = st.t.interval(0.95, 1, loc=d.mean(), scale=d.std(ddof=1) / math.sqrt(2))
    assert paired.ci == pytest.approx(want, abs=1e-12) and paired.ci[0] < 0 < paired.ci[1]
    rng = np.random.default_rng(0)
    for n in range(2, 10):
        for _ in range(20):
            a, b = rng.normal(0.5, 0.05, n), rng.normal(0.48, 0.05, n)
            p = stats.compare(dict(enumerate(a)), dict(enumerate(b)))
            ref = st.ttest_rel(a, b)
            assert p.ci_method == "t" and p.p == pytest.approx(ref.pvalue)
            assert (p.ci[0] > 0 or p.ci[1] < 0) == (p.p < 0.05)
    big = stats.compare(dict(enumerate(rng.normal(0.5, 0.05, 15))), dict(enumerate(rng.normal(0.5, 0.05, 15))))
    assert big.ci_method == "bootstrap" and big.note is None  # 10 pairs and more: the percentile bootstrap


def test_one_pair_has_no_interval_and_no_p_and_says_so():
    paired = stats.compare({0: 0.55, 1: 0.7}, {0: 0.5})
    assert paired.diff == pytest.approx(0.05) and math.isnan(paired.se)
    assert paired.ci is None and paired.ci_method is None and math.isnan(paired.p)
    assert paired.note == "1 pair: no standard error, interval or test"


def test_a_constant_difference_is_zero_variance_whatever_the_rounding():
    """Issue 39 (item 15): 0.5 - 0.4 and 0.45 - 0.35 differ in the 17th digit, so the old test read a spread of
    1e-17 and gave p = 1e-31 (or "-" when the rounding happened to agree)."""
    a, b = {0: 0.5, 1: 0.45, 2: 0.3}, {0: 0.4, 1: 0.35, 2: 0.2}
    assert np.ptp([a[s] - b[s] for s in a]) > 0  # the floats do differ
    paired = stats.compare(a, b, margin=0.2)
    assert paired.diff == pytest.approx(0.1) and paired.se == 0.0
    assert math.isnan(paired.p) and math.isnan(paired.t) and math.isnan(paired.tost_p) and paired.ci is None
    assert paired.note == "zero variance: all 3 pairs differ by +0.100 (no interval or test)"
    t, df, p = stats.one_sample_t([0.1 + 1e-17, 0.1, 0.1 - 2e-17])
    assert math.isnan(t) and math.isnan(p) and df == 2
    assert stats.is_constant([0.1, 0.1 + 1e-9]) is False  # a real spread, however small, is one
