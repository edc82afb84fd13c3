"""Unit checks of the four verifiers on hand-written completions."""

from __future__ import annotations

import time

import pytest

from grpolab.verifiers.exact import ExactMatchVerifier
from grpolab.verifiers.extract import boxed_contents, final_answer_region, find_numbers, normalize_number
from grpolab.verifiers.format import FormatVerifier
from grpolab.verifiers.gsm8k import GSM8KVerifier
from grpolab.verifiers.math import MathVerifier


# ------------------------------------------------------------------------------------------- helpers
def test_final_answer_region():
    assert final_answer_region("no tags 18") == "no tags 18"
    assert final_answer_region("<think>7</think> 18") == " 18"
    assert final_answer_region("reasoning 7</think> 18") == " 18"  # R1-Distill: <think> is in the prompt
    assert final_answer_region("<think>7 and never closed") == ""
    assert final_answer_region("<think>a</think><answer>18</answer> trailing 7") == "18"
    assert final_answer_region("<think>a</think>x <answer>1</answer><answer>18") == "18"


def test_boxed_contents_balances_braces():
    assert boxed_contents(r"\boxed{\frac{1}{2}} and \fbox{3}") == [r"\frac{1}{2}", "3"]
    assert boxed_contents(r"\boxed{} then \boxed{ } then \boxed{4}") == ["4"]
    assert boxed_contents(r"\boxed{\{1,2\}}") == [r"\{1,2\}"]
    assert boxed_contents(r"\boxed{5} \boxed{\frac{1}{") == ["5"]  # truncated box ignored


def test_numbers():
    assert find_numbers("a 5 - 8 = -3 b (-4) c 10-3 d 1,234,567.50 e 3,4") == [
        "5", "8", "-3", "-4", "10", "3", "1,234,567.50", "3", "4"
    ]  # fmt: skip
    assert normalize_number("−3") == normalize_number("-3") == -3  # Unicode minus
    assert normalize_number("\\$1,000.00.") == 1000
    assert normalize_number("10000000000000001") != normalize_number("10000000000000000")
    assert normalize_number("1 2") is None and normalize_number("x") is None and normalize_number("") is None


# ---------------------------------------------------------------------------------------------- gsm8k
@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        ("#### 18", "18", 1.0),
        ("####18", "18", 1.0),
        ("#### $18.00.", "18", 1.0),
        ("#### 1,000", "1000", 1.0),
        ("#### 1000", "1,000", 1.0),
        ("#### -3", "-3", 1.0),
        ("#### 3", "-3", 0.0),
        ("#### 180", "18", 0.0),
        ("#### 18\nQuestion: next one?\n#### 7", "18", 1.0),  # cut at the stop string "Question:"
        ("so 9 * 2 = 18", "18", 1.0),  # last number
        ("so 18 apples, 2 left", "18", 0.0),
        ("the answer is \\boxed{18}", "18", 1.0),
        ("\\boxed{18} or \\boxed{17}", "18", 0.0),  # hedge
        ("<think>#### 18</think>#### 17", "18", 0.0),  # reasoning is not the answer
        ("<think>it is 18 but I ran out of", "18", 0.0),
        ("", "18", 0.0),
        ("#### 18", "eighteen", None),  # unscorable gold
        ("#### 18", "Janet makes 9*2 = <<9*2=18>>18.\n#### 18", 1.0),  # a full solution as gold
    ],
)
def test_gsm8k(completion, gold, expected):
    assert GSM8KVerifier()([completion], answer=[gold]) == [expected]


def test_gsm8k_strict_marker():
    assert GSM8KVerifier(strict_marker=True)(["so 18", "#### 18"], answer=["18", "18"]) == [0.0, 1.0]


def test_length_mismatch_is_an_error():
    for v in (GSM8KVerifier(), MathVerifier(), ExactMatchVerifier()):
        with pytest.raises(ValueError, match="completions"):
            v(["a", "b"], answer=["1"])


# ----------------------------------------------------------------------------------------------- math
@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        (r"$\boxed{-2, 1}$", "-2,1", 1.0),  # bare gold would parse as -2.1
        (r"$\boxed{-2.1}$", "-2,1", 0.0),
        (r"$\boxed{1, -2}$", "-2,1", 1.0),  # a set of solutions
        (r"$\boxed{3}$ and again $\boxed{3}$", "3", 1.0),  # same answer twice is no hedge
        (r"$\boxed{\frac{1}{2}}$, i.e. $\boxed{0.5}$", "0.5", 1.0),  # equal forms
        (r"$\boxed{3}$ or $\boxed{5}$", "5", 0.0),  # hedge
        (r"<think>$\boxed{5}$</think>The answer is $\boxed{3}$.", "5", 0.0),
        (r"<think>$\boxed{5}$</think>The answer is $\boxed{3}$.", "3", 1.0),
        (r"<think>so $\boxed{5}$", "5", 0.0),  # never left the reasoning
        ("<think>x</think><answer>\\frac{3}{4}</answer>", "0.75", 1.0),
        ("The final answer is 1/2.", r"\frac12", 1.0),  # plain arithmetic, built without eval
        (r"$\boxed{28\%}$", r"28\%", 1.0),
        (r"$\boxed{x^2+2x+1}$", "(x+1)^2", 1.0),
        (r"$\boxed{x^2+2x+2}$", "(x+1)^2", 0.0),
        ("", "5", 0.0),
        ("The answer is 5", r"\frac{1}{", None),  # unparseable gold: unscorable, never correct
        ("The answer is 5", "", None),
    ],
)
def test_math(completion, gold, expected):
    assert MathVerifier()([completion], answer=[gold]) == [expected]


def test_math_hedges_allowed_when_configured():
    assert MathVerifier(reject_hedges=False)([r"$\boxed{3}$ or $\boxed{5}$"], answer=["5"]) == [1.0]


def test_math_never_evaluates_model_output(tmp_path):
    marker = tmp_path / "pwned"
    payloads = [
        f"The answer is: __import__('pathlib').Path({str(marker)!r}).touch()",
        f"answer: 1 + __import__('os').system('touch {marker}')",
        f"$\\boxed{{__import__('os').system('touch {marker}')}}$",
        f"Final answer is (lambda: open({str(marker)!r}, 'w'))()",
    ]
    assert MathVerifier()(payloads, answer=["5"] * len(payloads)) == [0.0] * len(payloads)
    assert not marker.exists()


def test_math_refuses_astronomical_numbers_quickly():
    """Power towers and huge factorials would hang sympy inside one C call (no timeout can cut that
    in-process); they are refused before comparison."""
    bombs = [
        r"$\boxed{9^{9^{9^{9}}}}$",
        r"$\boxed{10^{10^{10}}}$",
        "The answer is 9^9^9^9",
        r"$\boxed{99999999!}$",
    ]
    start = time.perf_counter()
    assert MathVerifier()(bombs, answer=["5"] * len(bombs)) == [0.0] * len(bombs)
    assert time.perf_counter() - start < 5.0
    assert MathVerifier()([r"$\boxed{2^{10}}$"], answer=["1024"]) == [1.0]  # ordinary powers still work


# --------------------------------------------------------------------------------------------- format
@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<think>2+2=4</think><answer>4</answer>", 1.0),
        ("<think>\n2+2=4\n</think>\n<answer>\n4\n</answer>\n", 1.0),
        ("<think>2+2=4</think>\n<answer>4</answer>\nAnd then some text", 0.0),  # MULTILINE $ loophole
        ("<think>2+2=4</think><answer>4</answer>junk", 0.0),
        ("preamble <think>a</think><answer>4</answer>", 0.0),
        ("<think>a</think><answer>4</answer><answer>5</answer>", 0.0),  # repeated tag
        ("<think>a<think>b</think></think><answer>4</answer>", 0.0),  # nested
        ("<think>a</think><answer>  </answer>", 0.0),  # empty answer
        ("<answer>4</answer>", 0.0),
        ("<think>a</think>", 0.0),
    ],
)
def test_format_think_answer(completion, expected):
    assert FormatVerifier()([completion], answer=["x"]) == [expected]


def test_format_think_mode():
    v = FormatVerifier(mode="think")
    assert v(["reasoning\n</think>\nThe answer is $\\boxed{4}$."]) == [1.0]
    assert v(["<think>reasoning</think> 4"]) == [1.0]
    assert v(["reasoning without closing"]) == [0.0]
    assert v(["a</think>4</think>5"]) == [0.0]
    assert v(["a</think>   "]) == [0.0]
    with pytest.raises(ValueError, match="mode"):
        FormatVerifier(mode="xml")


# ---------------------------------------------------------------------------------------------- exact
def test_exact():
    v = ExactMatchVerifier()
    assert v([" 42\n", "420", "4 2", "42"], answer=["42", "42", "42", ""]) == [1.0, 0.0, 0.0, None]
    assert ExactMatchVerifier(case_sensitive=False)(["Paris"], answer=["paris"]) == [1.0]


def test_every_verifier_has_a_name_and_accepts_extra_columns():
    for v in (ExactMatchVerifier(), GSM8KVerifier(), MathVerifier(), FormatVerifier()):
        assert isinstance(v.name, str) and v.name
        out = v(["#### 4"], answer=["4"], truncated=[False], uid=["t/0"], solution=["s"])
        assert len(out) == 1
