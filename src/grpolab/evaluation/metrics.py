"""Accuracy estimators from ``n`` sampled completions per prompt: mean@n, pass@k, maj@k.

Pure Python, no torch. Every function takes per-prompt counts or per-sample lists, so the same code
scores a test set in ``src/eval.py`` and a toy example in a test.

* **mean@n** (pass@1 estimated from ``n`` samples): the mean over prompts of the fraction of correct
  samples; unbiased for the probability that one sample is correct.
* **pass@k** (Chen et al., 2021, "Evaluating Large Language Models Trained on Code", eq. 1): with ``c``
  correct among ``n`` samples, ``1 - C(n-c, k) / C(n, k)`` is the unbiased estimate of the probability
  that at least one of ``k`` samples is correct. Computed exactly with integer binomials (Python's
  integers do not overflow), then rounded once to a float.
* **maj@k** (majority vote over ``k`` samples, Wang et al. 2022 "self-consistency"; Lewkowycz et al. 2022
  "maj1@k"): the most frequent extracted answer among ``k`` samples is the prediction.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from fractions import Fraction


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate for one prompt from ``n`` samples of which ``c`` are correct.

    ``pass@k = 1 - C(n - c, k) / C(n, k)`` (equivalently ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)``,
    the form of Chen et al.'s numpy code).

    Args:
        n: number of samples drawn for the prompt (>= 1).
        c: number of correct samples (0 <= c <= n).
        k: budget (1 <= k <= n).

    Returns:
        A probability in [0, 1]: 0.0 when ``c == 0``; 1.0 when ``n - c < k`` (every k-subset holds a
        correct sample, e.g. ``k == n`` and ``c >= 1``); ``c / n`` when ``k == 1``.

    Raises:
        ValueError: if ``n < 1``, ``c`` is outside ``[0, n]`` or ``k`` outside ``[1, n]`` (pass@k for
            ``k > n`` cannot be estimated from ``n`` samples).

    Examples:
        >>> pass_at_k(10, 3, 1)
        0.3
        >>> round(pass_at_k(4, 1, 2), 6)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        0.5
        >>> pass_at_k(5, 0, 5), pass_at_k(5, 1, 5)
        (0.0, 1.0)
    """
    if n < 1:
        raise ValueError(f"pass_at_k: n must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k must be in [1, n={n}], got {k}")
    if c == 0:
        return 0.0
    if n - c < k:
        return 1.0
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def mean_at_n(correct: Sequence[Sequence[float]]) -> float:
    """mean@n: the mean over prompts of each prompt's mean correctness (pass@1 estimated from n samples).

    Args:
        correct: one sequence per prompt of per-sample scores in [0, 1] (1/0 for verdicts; rewards work
            too). Prompts may have different numbers of samples; each prompt weighs the same.

    Returns:
        The mean, or NaN when no prompt has a sample.

    Raises:
        ValueError: if a score is NaN (drop unscorable samples before calling).

    Examples:
        >>> mean_at_n([[1, 0, 0, 1], [0, 0, 0, 0]])
        0.25
    """
    per_prompt = []
    for i, scores in enumerate(correct):
        if not len(scores):
            continue
        if any(math.isnan(float(s)) for s in scores):
            raise ValueError(f"mean_at_n: prompt {i} has a NaN score; leave unscorable samples out")
        per_prompt.append(sum(float(s) for s in scores) / len(scores))
    return sum(per_prompt) / len(per_prompt) if per_prompt else math.nan


def majority_vote(answers: Sequence[Hashable | None], correct: Sequence[float]) -> float:
    """Score the majority answer of one set of samples.

    Args:
        answers: the extracted final answer of each sample (any hashable, e.g. a normalised string);
            ``None`` means the sample gave no answer and abstains from the vote.
        correct: each sample's verdict (1/0), aligned with ``answers``.

    Returns:
        The verdict of the most frequent answer, where an answer's verdict is the mean verdict of the
        samples that gave it (the same for a deterministic verifier). Ties between several most frequent
        answers are broken uniformly at random *in expectation*: the result is the mean verdict of the
        tied answers (so a 1-1 tie between a right and a wrong answer scores 0.5), which keeps the
        estimate free of any order effect. 0.0 when every sample abstains.

    Raises:
        ValueError: if the two sequences differ in length.

    Examples:
        >>> majority_vote(["7", "7", "8"], [1, 1, 0])
        1.0
        >>> majority_vote(["7", "8"], [1, 0])  # tie
        0.5
        >>> majority_vote([None, None, "8"], [0, 0, 0])
        0.0
    """
    if len(answers) != len(correct):
        raise ValueError(f"majority_vote: {len(answers)} answers but {len(correct)} verdicts")
    votes: Counter = Counter(a for a in answers if a is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    winners = [a for a, v in votes.items() if v == top]
    verdicts = []
    for w in winners:
        own = [float(ok) for a, ok in zip(answers, correct) if a == w]
        verdicts.append(sum(own) / len(own))
    return sum(verdicts) / len(verdicts)


def maj_at_k(answers: Sequence[Hashable | None], correct: Sequence[float], k: int) -> float:
    """maj@k for one prompt from ``n >= k`` samples: the mean majority-vote verdict over the
    ``n // k`` disjoint blocks of ``k`` consecutive samples.

    Samples are i.i.d., so each block is an independent draw of "vote over k samples" and the mean is an
    unbiased estimate of maj@k that uses ``k * (n // k)`` of the samples (all of them when k divides n).

    Args:
        answers: extracted answer per sample (``None`` = no answer), length ``n``.
        correct: verdict per sample (1/0), aligned with ``answers``.
        k: votes per block (1 <= k <= n).

    Returns:
        A value in [0, 1]. ``maj@1`` is the mean verdict with abstaining samples counted as wrong
        (equal to ``mean(correct)`` whenever a sample without an answer is judged wrong).

    Raises:
        ValueError: if the lengths differ or ``k`` is outside ``[1, n]``.

    Examples:
        >>> maj_at_k(["1", "2", "2", "2"], [1, 0, 0, 0], 2)  # blocks (1,2): tie -> 0.5; (2,2) -> 0
        0.25
    """
    n = len(answers)
    if len(correct) != n:
        raise ValueError(f"maj_at_k: {n} answers but {len(correct)} verdicts")
    if not 1 <= k <= n:
        raise ValueError(f"maj_at_k: k must be in [1, n={n}], got {k}")
    blocks = n // k
    total = sum(majority_vote(answers[b * k:(b + 1) * k], correct[b * k:(b + 1) * k]) for b in range(blocks))
    return total / blocks


def standard_error(values: Sequence[float]) -> float:
    """Standard error of the mean of ``values`` (sample std with ddof=1 over sqrt(len)); NaN if < 2.

    Examples:
        >>> round(standard_error([0.0, 1.0, 0.0, 1.0]), 4)
        0.2887
    """
    m = len(values)
    if m < 2:
        return math.nan
    mean = sum(values) / m
    var = sum((v - mean) ** 2 for v in values) / (m - 1)
    return math.sqrt(var / m)
