"""Statistics of a sweep over seeds: mean and standard error, paired differences, their 95% interval, the paired
t-test and a TOST equivalence test. numpy/scipy/statsmodels (no Lightning): ``sweeps/report.py`` and
``sweeps/stale_rerun.py`` build their tables on it.

Every function takes plain sequences of floats (one value per seed) and returns floats; ``nan`` stands for "not
defined" (one seed has no standard error, a constant difference has no t statistic) rather than an exception.
The tests are the libraries' own: the paired t-test is ``scipy.stats.ttest_1samp`` on the differences (the same as
``ttest_rel``), its interval ``scipy.stats.t.interval``, TOST statsmodels' ``DescrStatsW.ttost_mean`` (Schuirmann
1987, two one-sided t-tests).

The interval of a mean paired difference (:func:`compare`): from :data:`BOOTSTRAP_MIN_N` pairs the percentile
bootstrap; below, the t interval (a percentile bootstrap of 2 values is their range, of a few values narrower
than the t interval, and could exclude 0 beside a p well above 0.05; the t interval excludes 0 exactly when the
t-test's p < 0.05); for 1 pair none. Differences that are all equal up to float rounding (:func:`is_constant`:
``0.5 - 0.4`` and ``0.45 - 0.35`` differ in the 17th digit) have zero variance: no interval and no test, said in
:attr:`Paired.note`, never a p computed from the rounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def _array(values: Sequence[float], name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1 or not len(arr):
        raise ValueError(f"{name}: expected a non-empty 1-d sequence of numbers, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name}: holds a value that is not finite: {arr.tolist()}")
    return arr


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample standard deviation, ddof=1, over sqrt(n)).

    Args:
        values: one number per seed, shape (n,).
    Returns:
        (mean, SE); SE is ``nan`` for n = 1.
    Raises:
        ValueError: empty input or a value that is not finite.
    """
    arr = _array(values, "values")
    se = float(arr.std(ddof=1) / math.sqrt(len(arr))) if len(arr) > 1 else math.nan
    return float(arr.mean()), se


def paired_differences(a: dict[object, float], b: dict[object, float]) -> tuple[list[object], np.ndarray]:
    """The differences ``a[s] - b[s]`` over the seeds ``s`` both hold (sorted), shape (n,) float64.

    Raises:
        ValueError: if the two share no seed.
    """
    common = sorted(set(a) & set(b), key=lambda s: (str(type(s)), s))
    if not common:
        raise ValueError(f"no seed in common to pair on: {sorted(map(str, a))} vs {sorted(map(str, b))}")
    return common, np.array([a[s] - b[s] for s in common], dtype=float)


def bootstrap_ci(values: Sequence[float], level: float = 0.95, n_boot: int = 10_000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean: resample the n values with replacement ``n_boot`` times and
    take the (1-level)/2 and (1+level)/2 quantiles of the resampled means (numpy's default linear quantiles).
    Deterministic for a given ``seed``, and independent of the values' order (they are sorted before resampling), so
    two reports that pair the same runs in another order give the same interval. With n <= 2 the interval is
    coarse (it only spans resampled means).

    Raises:
        ValueError: empty input, a non-finite value, or ``level`` outside (0, 1).
    """
    arr = _array(values, "values")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    arr = np.sort(arr)
    rng = np.random.default_rng(seed)
    means = arr[rng.integers(0, len(arr), size=(n_boot, len(arr)))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


ZERO_SPREAD = 1e-12  # relative: a spread below it (times the values' scale, at least 1) is float rounding


def is_constant(values: Sequence[float]) -> bool:
    """True when the values are equal up to float rounding: their range is at most :data:`ZERO_SPREAD` times the
    largest magnitude (at least 1). Scores are accuracies or rewards of order 1 whose real spread is far larger
    (mean@16 on 1024 prompts moves in steps of 6e-5); a difference of two such floats is off by about 1e-17."""
    arr = _array(values, "values")
    return bool(np.ptp(arr) <= ZERO_SPREAD * max(1.0, float(np.abs(arr).max())))


def one_sample_t(values: Sequence[float], mu: float = 0.0) -> tuple[float, int, float]:
    """Two-sided one-sample t-test of mean == ``mu`` (``scipy.stats.ttest_1samp``); on paired differences it is the
    paired t-test (``ttest_rel``).

    Returns:
        (t, degrees of freedom n-1, p). ``t`` and ``p`` are ``nan`` for n < 2 or zero spread (:func:`is_constant`).
    """
    from scipy import stats as st

    arr = _array(values, "values")
    df = len(arr) - 1
    if df < 1 or is_constant(arr):
        return math.nan, df, math.nan
    res = st.ttest_1samp(arr, mu)
    return float(res.statistic), df, float(res.pvalue)


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The t interval of the mean (``scipy.stats.t.interval``, df n-1, scale the SE); ``(nan, nan)`` for n < 2 or
    zero spread."""
    from scipy import stats as st

    arr = _array(values, "values")
    if len(arr) < 2 or is_constant(arr):
        return math.nan, math.nan
    mean, se = mean_se(arr)
    lo, hi = st.t.interval(level, len(arr) - 1, loc=mean, scale=se)
    return float(lo), float(hi)


def tost(values: Sequence[float], margin: float) -> float:
    """TOST equivalence p-value for "the mean lies within (-margin, +margin)" (statsmodels'
    ``DescrStatsW.ttost_mean``): the larger p of the one-sided t-tests of H0 mean <= -margin and H0 mean >= +margin.
    p < alpha means equivalent at level alpha (the 90% t interval lies inside the margins for alpha = 0.05).
    ``nan`` for n < 2 or zero spread.

    Raises:
        ValueError: if ``margin`` is not positive.
    """
    from statsmodels.stats.weightstats import DescrStatsW

    if not margin > 0:
        raise ValueError(f"margin must be positive, got {margin}")
    arr = _array(values, "values")
    if len(arr) < 2 or is_constant(arr):
        return math.nan
    return float(DescrStatsW(arr).ttost_mean(-margin, margin)[0])


BOOTSTRAP_MIN_N = 10  # pairs from which the interval is the percentile bootstrap; below, the t interval


@dataclass(frozen=True)
class Paired:
    """An arm against the baseline on their common seeds."""

    seeds: list
    diff: float  # mean of arm - baseline over the common seeds
    se: float  # SE of that mean (nan for one seed, 0 for zero variance)
    ci: tuple[float, float] | None  # 95% interval of the mean difference; None for one pair or zero variance
    ci_method: str | None  # "bootstrap" (BOOTSTRAP_MIN_N pairs or more), "t" (fewer), None (no interval)
    t: float
    df: int
    p: float  # paired t-test, two-sided (nan: one pair or zero variance)
    tost_p: float | None  # None without a margin (nan: one pair or zero variance)
    note: str | None = None  # why there is no interval or test, in words

    @property
    def ci_label(self) -> str:
        """``bootstrap 95% CI``, ``t 95% CI`` or ``no interval``."""
        return f"{self.ci_method} 95% CI" if self.ci_method else "no interval"


def compare(arm: dict[object, float], base: dict[object, float], margin: float | None = None,
            n_boot: int = 10_000, seed: int = 0) -> Paired:
    """Paired comparison of ``arm`` (seed -> value) with ``base`` (seed -> value) on the seeds both hold: the mean
    difference, its SE, its 95% interval (percentile bootstrap from :data:`BOOTSTRAP_MIN_N` pairs, t interval
    below, none for one pair or zero variance), the paired t-test and, with ``margin``, TOST.

    Raises:
        ValueError: no common seed; non-finite values; a margin that is not positive.
    """
    seeds, d = paired_differences(arm, base)
    n = len(d)
    diff, se = mean_se(d)
    t, df, p = one_sample_t(d)
    tost_p = None if margin is None else tost(d, margin)
    if n == 1:
        return Paired(seeds, diff, se, None, None, t, df, p, tost_p,
                      "1 pair: no standard error, interval or test")
    if is_constant(d):
        return Paired(seeds, diff, 0.0, None, None, t, df, p, tost_p,
                      f"zero variance: all {n} pairs differ by {diff:+.3f} (no interval or test)")
    if n >= BOOTSTRAP_MIN_N:
        return Paired(seeds, diff, se, bootstrap_ci(d, n_boot=n_boot, seed=seed), "bootstrap", t, df, p, tost_p)
    return Paired(seeds, diff, se, t_interval(d), "t", t, df, p, tost_p)
