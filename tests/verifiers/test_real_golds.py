"""Every real gold answer, written the way the prompt asks, verifies as correct; a perturbed one does not.

GSM8K: all 1319 test and 7473 train golds (the verifier is fast). MATH-500: all 500 answers, in the
``\\boxed{}`` format the math instruction asks for, plus each row's reference solution; scored through
``Verifier`` with 2 worker processes (about half the wall time of in-process scoring on 2 cores, and
it exercises the worker path on real data).
"""

from __future__ import annotations

import json
import re

import pytest

from grpolab.tasks.gsm8k import gsm8k_gold
from grpolab.tasks.loading import strip_calculator_annotations
from grpolab.verifiers.gsm8k import GSM8KVerifier
from grpolab.verifiers.math import MathVerifier
from grpolab.verifiers.reward import Verifier


def _jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ----------------------------------------------------------------------------------------------- GSM8K
@pytest.fixture(scope="module", params=["test", "train"])
def gsm8k_rows(request, shared_data):
    rows = _jsonl(shared_data / "gsm8k" / f"{request.param}.jsonl")
    assert len(rows) == {"test": 1319, "train": 7473}[request.param]
    return rows


def test_gsm8k_golds_have_the_documented_quirks(shared_data):
    finals = [
        r["answer"].rsplit("####", 1)[1].strip()
        for s in ("train", "test")
        for r in _jsonl(shared_data / "gsm8k" / f"{s}.jsonl")
    ]
    assert sum("," in f for f in finals) == 93  # thousands separators (SOURCES.md)
    assert sum(f.startswith("-") for f in finals) == 5  # negatives
    assert all(re.fullmatch(r"-?\d{1,3}(,\d{3})*|-?\d+", f) for f in finals)


def test_gsm8k_every_gold_in_answer_format_is_correct(gsm8k_rows):
    golds = [gsm8k_gold(r["answer"]) for r in gsm8k_rows]
    assert all(g is not None and "," not in g for g in golds)
    # The reference solution itself ends with '#### <gold as written>' (93 of them with commas).
    solutions = [strip_calculator_annotations(r["answer"]) for r in gsm8k_rows]
    assert GSM8KVerifier()(solutions, answer=golds) == [1.0] * len(golds)
    # The gold exactly as the prompt asks: reasoning, then '#### N'.
    bare = [f"Step by step.\n#### {g}" for g in golds]
    assert GSM8KVerifier()(bare, answer=golds) == [1.0] * len(golds)


def test_gsm8k_every_perturbed_gold_is_wrong(gsm8k_rows):
    golds = [gsm8k_gold(r["answer"]) for r in gsm8k_rows]
    v = GSM8KVerifier()
    plus_one = [f"Step by step.\n#### {int(g) + 1}" for g in golds]
    assert v(plus_one, answer=golds) == [0.0] * len(golds)
    # Substring traps: the gold's digits inside a longer number, on either side.
    appended = [f"#### {g}5" for g in golds]
    assert v(appended, answer=golds) == [0.0] * len(golds)
    prefixed = [f"#### 1{g.lstrip('-')}" for g in golds]
    assert v(prefixed, answer=golds) == [0.0] * len(golds)


# -------------------------------------------------------------------------------------------- MATH-500
def perturb(gold: str) -> str:
    """Change the value of a LaTeX answer: bump its first digit (or append +1 when it has none).

    The first digit, not the last: bumping the last digit of ``52_8`` changes the base (math-verify drops
    subscripts), of ``.0000672`` it hides below math-verify's 6-decimal rounding, and of
    ``864 \\mbox{ inches}^2`` it changes the unit's exponent, which is normalised away.
    """
    m = re.search(r"\d", gold)
    if m is None:
        return gold + "+1"
    return gold[: m.start()] + str((int(m.group()) + 1) % 10) + gold[m.end() :]


@pytest.fixture(scope="module")
def math_scores(shared_data):
    rows = _jsonl(shared_data / "math500" / "test.jsonl")
    assert len(rows) == 500
    golds = [r["answer"] for r in rows]
    completions = (
        [f"Let me think step by step.\nThe final answer is $\\boxed{{{g}}}$." for g in golds]
        + [f"Let me think step by step.\nThe final answer is $\\boxed{{{perturb(g)}}}$." for g in golds]
        + [r["solution"] for r in rows]
    )
    rm = Verifier({"math": MathVerifier()}, timeout_s=60.0, num_workers=2)
    try:
        out = rm(completions, answer=golds * 3)
    finally:
        rm.close()
    assert out.num_timeouts == 0 and out.num_crashed == 0
    return golds, out.rewards


def test_math500_every_gold_in_boxed_format_is_correct(math_scores):
    golds, rewards = math_scores
    assert [g for g, r in zip(golds, rewards[:500], strict=True) if r is None] == []  # every gold parses
    wrong = [g for g, r in zip(golds, rewards[:500], strict=True) if r != 1.0]
    assert wrong == []


def test_math500_every_perturbed_gold_is_wrong(math_scores):
    golds, rewards = math_scores
    accepted = [(g, perturb(g)) for g, r in zip(golds, rewards[500:1000], strict=True) if r != 0.0]
    assert accepted == []


def test_math500_every_reference_solution_is_correct(math_scores):
    golds, rewards = math_scores
    wrong = [g for g, r in zip(golds, rewards[1000:], strict=True) if r != 1.0]
    assert wrong == []
