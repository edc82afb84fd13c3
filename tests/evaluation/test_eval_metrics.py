"""pass@k, maj@k, mean@n against hand-computed values, and the summary of an evaluation's records."""

import math
from math import comb

import numpy as np
import pytest

from grpolab.evaluation.evaluate import default_ks, summarize
from grpolab.evaluation.metrics import maj_at_k, majority_vote, mean_at_n, pass_at_k, standard_error


def chen_numpy(n: int, c: int, k: int) -> float:
    """Chen et al. (2021)'s reference implementation (Codex paper, Figure 3)."""
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        (5, 2, 2, 1 - 3 / 10),          # 1 - C(3,2)/C(5,2)
        (10, 3, 5, 1 - 21 / 252),       # 1 - C(7,5)/C(10,5) = 0.916667
        (4, 1, 2, 0.5),                 # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (10, 3, 1, 0.3),                # k = 1 is c/n
        (8, 5, 4, 1.0),                 # n - c = 3 < k: every 4-subset has a correct sample
        (20, 1, 10, 0.5),               # 1 - C(19,10)/C(20,10) = 1 - 10/20
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_edge_cases_n_equals_k_and_no_correct_sample():
    for n in (1, 4, 16):
        assert pass_at_k(n, 0, n) == 0.0           # c = 0, n = k
        assert pass_at_k(n, 1, n) == 1.0           # n = k: one correct sample is enough
        assert pass_at_k(n, n, n) == 1.0
        for k in range(1, n + 1):
            assert pass_at_k(n, 0, k) == 0.0       # c = 0: never
            assert pass_at_k(n, n, k) == 1.0       # all correct: always


def test_pass_at_k_matches_the_reference_and_rises_with_k():
    for n in (1, 2, 7, 16, 50):
        for c in range(n + 1):
            values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
            assert values == pytest.approx([chen_numpy(n, c, k) for k in range(1, n + 1)], abs=1e-9)
            assert all(b >= a - 1e-12 for a, b in zip(values, values[1:]))
            assert values[0] == pytest.approx(c / n)
    # large n: exact integers, no overflow
    assert pass_at_k(1000, 10, 100) == pytest.approx(1 - comb(990, 100) / comb(1000, 100), rel=1e-12)


@pytest.mark.parametrize("n,c,k", [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_impossible_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_majority_vote_and_ties():
    assert majority_vote(["7", "7", "8"], [1, 1, 0]) == 1.0
    assert majority_vote(["7", "8", "8"], [1, 0, 0]) == 0.0
    assert majority_vote(["7", "8"], [1, 0]) == 0.5                    # 1-1 tie: expected value of a coin flip
    assert majority_vote(["7", "7", "8", "8"], [1, 1, 0, 0]) == 0.5    # 2-2 tie
    assert majority_vote(["1", "2", "3"], [0, 1, 0]) == pytest.approx(1 / 3)  # three-way tie
    assert majority_vote(["8", "8", "7", "7", "6"], [0, 0, 0, 0, 1]) == 0.0   # tie between two wrong answers
    assert majority_vote([None, None, "8"], [0, 0, 1]) == 1.0          # abstentions do not vote
    assert majority_vote([None, None], [0, 0]) == 0.0                  # nobody answered
    assert majority_vote([], []) == 0.0
    with pytest.raises(ValueError):
        majority_vote(["1"], [1, 0])


def test_maj_at_k_uses_disjoint_blocks():
    answers, correct = ["1", "2", "2", "2"], [1, 0, 0, 0]
    assert maj_at_k(answers, correct, 1) == 0.25          # maj@1 = mean verdict
    assert maj_at_k(answers, correct, 2) == 0.25          # blocks (1,2) tie -> 0.5, (2,2) -> 0
    assert maj_at_k(answers, correct, 4) == 0.0           # one block, "2" wins 3-1
    assert maj_at_k(["5", "5", "3"], [1, 1, 0], 2) == 1.0  # n // k = 1 block; the last sample is unused
    assert maj_at_k(["a", "b", "a", "b"], [1, 0, 1, 0], 4) == 0.5  # n = k with a tie
    for k in (0, 5):
        with pytest.raises(ValueError):
            maj_at_k(answers, correct, k)


def test_mean_at_n_weighs_prompts_equally():
    assert mean_at_n([[1, 0, 0, 1], [0, 0, 0, 0]]) == 0.25
    assert mean_at_n([[1], [0, 0, 0, 0]]) == 0.5          # each prompt counts once, whatever its n
    assert mean_at_n([[], [1, 1]]) == 1.0                  # a prompt without samples is left out
    assert math.isnan(mean_at_n([]))
    with pytest.raises(ValueError, match="NaN"):
        mean_at_n([[1.0, float("nan")]])


def test_standard_error():
    assert standard_error([0.0, 1.0, 0.0, 1.0]) == pytest.approx(math.sqrt(1 / 3 / 4))
    assert math.isnan(standard_error([1.0]))


def test_default_ks():
    assert default_ks(16) == [1, 2, 4, 8, 16]
    assert default_ks(50) == [1, 2, 4, 8, 16, 32, 50]
    assert default_ks(1) == [1]


def _rec(uid, reward, answer, greedy=False, truncated=False, length=3):
    return {"uid": uid, "greedy": greedy, "reward": reward, "answer_extracted": answer, "truncated": truncated,
            "length": length}


def test_summarize_records():
    nan = float("nan")
    records = [
        # prompt a: 1 of 4 correct; the majority answer "9" is wrong
        _rec("a", 1.0, "7"), _rec("a", 0.0, "9"), _rec("a", 0.0, "9"), _rec("a", 0.0, "9", truncated=True, length=6),
        # prompt b: 3 of 4 correct
        _rec("b", 1.0, "5"), _rec("b", 1.0, "5"), _rec("b", 0.0, "4"), _rec("b", 1.0, "5"),
        # prompt c: one unscorable sample, 0 of 3 correct
        _rec("c", 0.0, "1"), _rec("c", nan, None), _rec("c", 0.0, "2"), _rec("c", 0.0, "2"),
        _rec("a", 0.0, "9", greedy=True), _rec("b", 1.0, "5", greedy=True), _rec("c", 0.0, "2", greedy=True, length=6,
                                                                                truncated=True),
    ]
    out = summarize(records, n=4, ks=[1, 2, 4], threshold=1.0)
    assert out["num_prompts"] == 3 and out["num_unscorable"] == 1
    assert out["accuracy"] == pytest.approx((1 / 4 + 3 / 4 + 0) / 3)
    assert out["pass@1"] == pytest.approx(out["accuracy"])
    # pass@2: a: 1 - C(3,2)/C(4,2) = 0.5; b: 1 - 0 = 1; c (3 scorable): 0
    assert out["pass@2"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    # pass@4 needs 4 scorable samples: prompt c is left out
    assert out["pass@4"] == pytest.approx(1.0) and out["num_prompts_short"] == {"4": 1}
    assert out["pass@1"] <= out["pass@2"] <= out["pass@4"]
    # maj@4: a -> "9" wrong, b -> "5" right; maj@2 blocks: a (7,9) tie 0.5, (9,9) 0; b (5,5) 1, (4,5) tie 0.5;
    # c has 3 scorable samples: one block (1,2) tie -> 0
    assert out["maj@4"] == pytest.approx(0.5)
    assert out["maj@2"] == pytest.approx((0.25 + 0.75 + 0.0) / 3)
    assert out["greedy_accuracy"] == pytest.approx(1 / 3)
    assert out["truncated_ratio"] == pytest.approx(1 / 12) and out["greedy_truncated_ratio"] == pytest.approx(1 / 3)
    assert out["mean_length"] == pytest.approx((11 * 3 + 6) / 12)
