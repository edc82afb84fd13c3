"""The verifiers against ../shared/data/verifier_cases.jsonl: known ways public graders go wrong."""

from __future__ import annotations

import json

import pytest

from grpolab.verifiers.gsm8k import GSM8KVerifier
from grpolab.verifiers.math import MathVerifier

# Every case where our verdict differs from the file's ``expected``, with the reason. The test fails if
# this list is incomplete OR out of date, so a behaviour change is always a conscious edit here.
KNOWN_DISAGREEMENTS = {
    "gsm_number_after_answer": (
        "'She earns 18 dollars each day, which I verified in 3 steps.' has no '####' and no box, so the "
        "last-number fallback reads 3. Semantically 18 is the answer, but finding it needs language "
        "understanding; the case's own note says a reward that demands an explicit marker would "
        "legitimately return false. We keep the documented fallback (the last number of the final answer)."
    ),
}


@pytest.fixture(scope="module")
def cases(shared_data):
    path = shared_data / "verifier_cases.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def verdicts(cases):
    verifiers = {"gsm8k": GSM8KVerifier(), "math": MathVerifier()}
    out = {}
    for case in cases:
        (score,) = verifiers[case["task"]]([case["output"]], answer=[case["gold"]])
        assert score is not None, f"{case['id']}: gold {case['gold']!r} should be scorable"
        out[case["id"]] = score == 1.0
    return out


def test_agreement_rate_and_listed_disagreements(cases, verdicts):
    disagreements = {c["id"] for c in cases if verdicts[c["id"]] != c["expected"]}
    assert disagreements == set(KNOWN_DISAGREEMENTS), (
        f"unlisted: {sorted(disagreements - set(KNOWN_DISAGREEMENTS))}, "
        f"no longer disagreeing: {sorted(set(KNOWN_DISAGREEMENTS) - disagreements)}"
    )
    rate = 1 - len(disagreements) / len(cases)
    assert rate >= 0.95, f"agreement {rate:.1%} < 95%"


def test_every_case_is_covered(cases):
    assert len(cases) == 29
    assert {c["task"] for c in cases} == {"gsm8k", "math"}
    assert len({c["id"] for c in cases}) == len(cases)


@pytest.mark.parametrize(
    "case_id",
    [
        "gsm_wrong_contains_gold_digits",  # substring '18' in '180'
        "math_multiple_boxed_hedge_last",  # hedge: right answer last
        "math_multiple_boxed_hedge_first",  # hedge: right answer first
        "math_bigint_float",  # integers beyond 2**53
        "math_low_precision_decimal",  # 0.33 vs 1/3
        "math_qwen_single_letter_unit",  # '4 + a' is not 4
    ],
)
def test_false_positives_of_public_graders_are_rejected(cases, verdicts, case_id):
    case = next(c for c in cases if c["id"] == case_id)
    assert case["expected"] is False
    assert verdicts[case_id] is False
