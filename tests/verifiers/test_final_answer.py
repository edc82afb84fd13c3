"""Which answer counts: the last final answer, on every extraction path.

What public graders do (checked in their sources):

- verl ``verl/utils/reward_score/gsm8k.py`` (``method="strict"``, its default): ``solutions =
  re.findall("#### (\\-?[0-9\\.\\,]+)", ...)``, "take the last solution", ``solutions[-1]``; a
  completion without ``#### N`` scores 0 (no last-number fallback). ``method="flexible"`` takes the last
  number.
- lm-evaluation-harness ``lm_eval/tasks/gsm8k/gsm8k.yaml``: generation stops at ``until: ["Question:",
  "</s>", "<|im_end|>"]``; ``strict-match`` takes the first ``#### N`` of that (already cut) text,
  ``flexible-extract`` the last number (``group_select: -1``).
- math-verify ``math_verify/parser.py``: within a priority group, matches are sorted by end position and
  tried right-most first, so the last box / last answer wins.
- Qwen2.5-Math ``evaluation/parser.py`` ``extract_answer``: ``pred_str.split("boxed")[-1]`` (last box),
  ``split("he answer is")[-1]``, else the last number (``use_last_number``).

So: the last ``####`` and the last box count, continuations after a stop string are cut as lm-eval does,
hedged boxes ("3 or 5") still score 0 (math-verify-based graders), and a completion cut off by the length
limit before any marker does not earn the reward through its last number (verl's strict default).
Completions are built from real rows of ../shared/data.
"""

from __future__ import annotations

import json

import pytest

from grpolab.tasks.gsm8k import gsm8k_gold
from grpolab.tasks.loading import strip_calculator_annotations
from grpolab.verifiers.gsm8k import GSM8KVerifier
from grpolab.verifiers.math import MathVerifier
from grpolab.verifiers.reward import Verifier


def _jsonl(path, n):
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines[:n]]


@pytest.fixture(scope="module")
def gsm_rows(shared_data):
    rows = _jsonl(shared_data / "gsm8k" / "test.jsonl", 60)
    out = []
    for r in rows:
        solution = strip_calculator_annotations(r["answer"])
        body = solution.rsplit("####", 1)[0].rstrip()
        out.append({"body": body, "gold": gsm8k_gold(r["answer"])})
    return out


@pytest.fixture(scope="module")
def math_rows(shared_data):
    return _jsonl(shared_data / "math500" / "test.jsonl", 30)


def _wrong(gold: str) -> str:
    return str(int(gold) + 7) if gold.lstrip("-").isdigit() else "7"


def test_gsm8k_a_corrected_marker_counts_not_the_first(gsm_rows):
    v = GSM8KVerifier()
    completions = [f"#### {_wrong(r['gold'])}\nWait, let me redo it.\n{r['body']}\n#### {r['gold']}" for r in gsm_rows]
    assert v(completions, answer=[r["gold"] for r in gsm_rows]) == [1.0] * len(gsm_rows)
    # ... and the other way round: a right answer corrected into a wrong one is wrong.
    flipped = [f"{r['body']}\n#### {r['gold']}\nHmm, no.\n#### {_wrong(r['gold'])}" for r in gsm_rows]
    assert v(flipped, answer=[r["gold"] for r in gsm_rows]) == [0.0] * len(gsm_rows)


def test_gsm8k_a_corrected_box_counts_and_a_hedge_does_not(gsm_rows):
    v = GSM8KVerifier()
    golds = [r["gold"] for r in gsm_rows]
    corrected = [f"{r['body']} so \\boxed{{{_wrong(r['gold'])}}}. Wait, that is wrong: \\boxed{{{r['gold']}}}"
                 for r in gsm_rows]
    assert v(corrected, answer=golds) == [1.0] * len(gsm_rows)
    hedged = [f"{r['body']} so $\\boxed{{{_wrong(r['gold'])}}}$ or $\\boxed{{{r['gold']}}}$" for r in gsm_rows]
    assert v(hedged, answer=golds) == [0.0] * len(gsm_rows)


def test_gsm8k_a_new_few_shot_question_after_the_answer_is_cut(gsm_rows):
    # lm-eval stops generation at "Question:"; a continuation's own "####" must not replace the answer.
    v = GSM8KVerifier()
    completions = [f"{r['body']}\n#### {r['gold']}\n\nQuestion: Tom has 3 apples and 4 more.\nAnswer: 7\n#### 7"
                   for r in gsm_rows]
    assert v(completions, answer=[r["gold"] for r in gsm_rows]) == [1.0] * len(gsm_rows)
    assert GSM8KVerifier(stop_strings=None)(completions[:1], answer=[gsm_rows[0]["gold"]]) == [0.0]


def test_gsm8k_a_cut_off_completion_does_not_earn_the_reward_through_its_last_number(gsm_rows):
    # The reference reasoning without its "#### N" line ends on the gold number in most rows: a stopped
    # completion gets the last-number fallback, one cut by the length limit does not.
    v = GSM8KVerifier()
    rows = [r for r in gsm_rows if v([r["body"]], answer=[r["gold"]]) == [1.0]]
    assert len(rows) >= 10
    golds = [r["gold"] for r in rows]
    texts = [r["body"] for r in rows]
    assert v(texts, answer=golds, truncated=[True] * len(rows)) == [0.0] * len(rows)
    # Through the reward model with the default config's policy (on_truncated: score), as in training.
    rm = Verifier({"gsm8k": GSM8KVerifier()}, timeout_s=None, on_truncated="score")
    assert rm(texts, answer=golds, truncated=[True] * len(rows)).rewards == [0.0] * len(rows)
    # A cut-off completion that did write its marker keeps its reward.
    marked = [f"{t}\n#### {g}\nLet me double" for t, g in zip(texts, golds, strict=True)]
    assert v(marked, answer=golds, truncated=[True] * len(rows)) == [1.0] * len(rows)


def test_math_a_corrected_box_counts_and_a_hedge_does_not(math_rows):
    v = MathVerifier()
    golds = [r["answer"] for r in math_rows]
    corrected = [f"So the answer is $\\boxed{{12345}}$. Wait, I made an error. Redoing it: $\\boxed{{{g}}}$." for g in golds]
    assert v(corrected, answer=golds) == [1.0] * len(golds)
    wrong_last = [f"So the answer is $\\boxed{{{g}}}$. Wait, I made an error: $\\boxed{{12345}}$." for g in golds]
    assert v(wrong_last, answer=golds) == [0.0] * len(golds)
    hedged = [f"The answer is either $\\boxed{{12345}}$ or $\\boxed{{{g}}}$." for g in golds]
    assert v(hedged, answer=golds) == [0.0] * len(golds)


def test_math_without_a_box_the_last_stated_answer_counts():
    v = MathVerifier()
    assert v(["The answer is $7$. No wait, recounting, the answer is $18$."], answer=["18"]) == [1.0]
    assert v(["The answer is $18$. No wait, recounting, the answer is $7$."], answer=["18"]) == [0.0]


@pytest.mark.parametrize(
    "text,expected",
    [
        (r"\boxed{3}", ["3"]),
        (r"\boxed{3} then more work \boxed{5}", ["5"]),
        (r"either $\boxed{3}$ or $\boxed{5}$.", ["3", "5"]),
        (r"\boxed{3}, \boxed{4}, \boxed{5}", ["3", "4", "5"]),
        (r"\boxed{1} Oops. \boxed{3} or \boxed{5}", ["3", "5"]),
        ("no box", []),
    ],
)
def test_final_boxed_contents(text, expected):
    from grpolab.verifiers.extract import final_boxed_contents

    assert final_boxed_contents(text) == expected
