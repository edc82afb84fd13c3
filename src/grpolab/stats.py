"""Statistics of a sweep over seeds: mean and standard error, paired differences, a bootstrap interval, the paired
t-test and a TOST equivalence test. Pure numpy/scipy (no Lightning): ``sweeps/report.py`` builds its tables on it.

Every function takes plain sequences of floats (one value per seed) and returns floats; ``nan`` stands for "not
defined" (one seed has no standard error, a constant difference has no t statistic) rather than an exception.
The tests are the textbook ones (e.g. scipy.stats.ttest_rel; TOST: Schuirmann 1987, two one-sided t-tests).
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


def one_sample_t(values: Sequence[float], mu: float = 0.0) -> tuple[float, int, float]:
    """Two-sided one-sample t-test of mean == ``mu``; on paired differences it is the paired t-test.

    Returns:
        (t, degrees of freedom n-1, p). ``t`` and ``p`` are ``nan`` for n < 2 or zero spread.
    """
    from scipy import stats as st

    arr = _array(values, "values")
    mean, se = mean_se(arr)
    df = len(arr) - 1
    if df < 1 or np.ptp(arr) == 0:  # equal values: no spread (their float std may be 1e-17, not 0)
        return math.nan, df, math.nan
    t = (mean - mu) / se
    return float(t), df, float(2 * st.t.sf(abs(t), df))


def tost(values: Sequence[float], margin: float) -> float:
    """TOST equivalence p-value for "the mean lies within (-margin, +margin)": the larger p of the one-sided
    t-tests of H0 mean <= -margin and H0 mean >= +margin. p < alpha means equivalent at level alpha (the
    90% t interval lies inside the margins for alpha = 0.05). ``nan`` for n < 2 or zero spread.

    Raises:
        ValueError: if ``margin`` is not positive.
    """
    from scipy import stats as st

    if not margin > 0:
        raise ValueError(f"margin must be positive, got {margin}")
    arr = _array(values, "values")
    mean, se = mean_se(arr)
    df = len(arr) - 1
    if df < 1 or np.ptp(arr) == 0:
        return math.nan
    p_low = st.t.sf((mean + margin) / se, df)  # H0: mean <= -margin
    p_high = st.t.cdf((mean - margin) / se, df)  # H0: mean >= +margin
    return float(max(p_low, p_high))


@dataclass(frozen=True)
class Paired:
    """An arm against the baseline on their common seeds."""

    seeds: list
    diff: float  # mean of arm - baseline over the common seeds
    se: float  # SE of that mean (nan for one seed)
    ci: tuple[float, float]  # bootstrap 95% interval of the mean difference
    t: float
    df: int
    p: float  # paired t-test, two-sided
    tost_p: float | None  # None without a margin


def compare(arm: dict[object, float], base: dict[object, float], margin: float | None = None,
            n_boot: int = 10_000, seed: int = 0) -> Paired:
    """Paired comparison of ``arm`` (seed -> value) with ``base`` (seed -> value) on the seeds both hold.

    Raises:
        ValueError: no common seed; non-finite values; a margin that is not positive.
    """
    seeds, d = paired_differences(arm, base)
    diff, se = mean_se(d)
    t, df, p = one_sample_t(d)
    return Paired(seeds=seeds, diff=diff, se=se, ci=bootstrap_ci(d, n_boot=n_boot, seed=seed), t=t, df=df, p=p,
                  tost_p=None if margin is None else tost(d, margin))
