"""MATH-style answer checking with math-verify, hardened for use as an RL reward.

What this adds to ``math_verify.parse`` / ``math_verify.verify``, and why:

- **Golds are wrapped before parsing.** A bare gold goes through math-verify's plain-text extractor,
  where ``-2,1`` reads as the decimal -2.1 and ``\\frac34`` is not found at all; ``\\boxed{<gold>}`` is
  parsed as LaTeX (``{-2, 1}``, ``3/4``). A trailing ``\\%`` in the gold is dropped (MATH's ``28\\%`` is
  answered ``28``). A gold that still does not parse makes the row **unscorable** (``None``), never
  correct (docs/guide/pitfalls.md #12).
- **Only the final-answer region counts**: text after the last ``</think>``, inside ``<answer>`` tags
  when present (:func:`grpolab.verifiers.extract.final_answer_region`). A box inside the reasoning is
  not the answer.
- **The last final answer counts; hedges score 0.** A box followed by more reasoning and another box
  (a correction) is graded on the last box, as math-verify (right-most match first), Qwen2.5-Math
  (``split("boxed")[-1]``) and hendrycks' ``last_boxed_only_string`` do. Boxes joined only by "or" or
  commas (``\\boxed{3}`` or ``\\boxed{5}``) are one hedged answer and score 0 unless all equal the gold
  (:func:`grpolab.verifiers.extract.final_boxed_contents`). Without a box, math-verify's own order picks
  the last answer-like match.
- **No model output is evaluated as code.** math-verify's plain-expression extractor hands strings such
  as ``1/2`` or ``3+4`` to ``sympy.parse_expr``, which calls Python's ``eval``. We run math-verify's own
  extraction regexes and LaTeX parser (an ANTLR grammar) but build plain arithmetic with a whitelist
  walk over :func:`ast.parse` (parsing only; numbers and ``+ - * / ^`` become unevaluated sympy nodes).
- **Sizes are bounded.** Power towers (``9^{9^{9^9}}``), huge exponents and factorials make sympy compute
  for hours inside a single C call, where no in-process timeout can interrupt it; such predictions are
  refused (0.0) before comparison. Anything else that is slow is cut by
  :class:`grpolab.verifiers.reward.Verifier`'s time limit (math-verify's own ``signal.alarm`` timeout
  is disabled here: it fails off the main thread).
"""

from __future__ import annotations

import ast
import logging
import math
import re
import threading
from functools import lru_cache
from typing import Any

import sympy
from math_verify import ExprExtractionConfig, LatexExtractionConfig, verify
from math_verify.parser import extract_expr, extract_latex, get_extraction_regexes

from grpolab.verifiers.extract import final_answer_region, final_boxed_contents

log = logging.getLogger(__name__)

_GOLD_CONFIG = (LatexExtractionConfig(),)
_PRED_CONFIG = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())
_BOX_CONFIG = (LatexExtractionConfig(boxed_match_priority=0),)

# Largest integer we let sympy build: 10**5 decimal digits. Anything bigger is not a MATH answer.
_MAX_DIGITS = 100_000
_MAX_FACTORIAL_ARG = 10_000
_MAX_ARITH_CHARS = 200
_TRAILING_PERCENT_RE = re.compile(r"\s*(?:\\%|%)\s*$")
_TRAILING_PERIOD_RE = re.compile(r"(?<!\\)\.\s*$")


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once that its timeout is off; ours is in Verifier, so drop that line."""

    def filter(self, record: logging.LogRecord) -> bool:  # noqa: D102 - logging API
        return not str(record.msg).startswith("Timeout is disabled")


logging.getLogger("math_verify.grader").addFilter(_DropTimeoutDisabledWarning())


# --------------------------------------------------------------------------------------- extraction
def _arith_to_sympy(expr: str) -> sympy.Basic:
    """Turn plain arithmetic (digits, ``. + - * / ^ ( )``, ``×``, ``÷``) into an unevaluated sympy tree.

    ``ast.parse`` only parses; the tree is walked with a whitelist, so no name, call or attribute can
    appear. ``^`` means power, as in math-verify.

    Raises:
        ValueError: on anything but numbers and the arithmetic operators, or on text over 200 chars.
        SyntaxError: if ``expr`` is not an expression.
    """
    if len(expr) > _MAX_ARITH_CHARS:
        raise ValueError("expression too long")
    src = expr.replace("\n", " ").replace("^", "**").replace("×", "*").replace("÷", "/").strip()
    tree = ast.parse(src, mode="eval")

    def build(node: ast.AST) -> sympy.Basic:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return sympy.Number(ast.get_source_segment(src, node) or repr(node.value))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            inner = build(node.operand)
            return sympy.Mul(-1, inner, evaluate=False) if isinstance(node.op, ast.USub) else inner
        if isinstance(node, ast.BinOp):
            a, b = build(node.left), build(node.right)
            if isinstance(node.op, ast.Add):
                return sympy.Add(a, b, evaluate=False)
            if isinstance(node.op, ast.Sub):
                return sympy.Add(a, sympy.Mul(-1, b, evaluate=False), evaluate=False)
            if isinstance(node.op, ast.Mult):
                return sympy.Mul(a, b, evaluate=False)
            if isinstance(node.op, ast.Div):
                return sympy.Mul(a, sympy.Pow(b, -1, evaluate=False), evaluate=False)
            if isinstance(node.op, ast.Pow):
                return sympy.Pow(a, b, evaluate=False)
        raise ValueError(f"not plain arithmetic: {type(node).__name__}")

    return build(tree.body)


def _extract_expr_safely(match: re.Match) -> tuple[Any, str]:
    """math-verify's ``extract_expr`` without its ``parse_expr`` (``eval``) branch."""
    groups = match.groupdict()
    if any(v for k, v in groups.items() if k.startswith(("integer", "decimal"))):
        return extract_expr(match)  # numbers only: sympy.Number(str), no eval
    expr = groups.get("expr") or ""
    if expr:
        try:
            return _arith_to_sympy(expr), expr
        except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
            pass
    return None, expr


def _extract(text: str, configs: tuple) -> list[Any]:
    """The extraction loop of ``math_verify.parse`` (``fallback_mode="first_match"``,
    ``extraction_mode="any_match"``) with safe expression building and no signal-based timeout.

    Patterns are grouped by priority; within a group the right-most match is tried first, and the first
    one that parses wins. The first matched string is appended as a fallback for string comparison.
    """
    target_res = get_extraction_regexes(configs)
    patterns = sorted(
        ((pattern, target, priority) for res, target in target_res for pattern, priority in res),
        key=lambda x: x[2],
    )
    extracted: list[Any] = []
    fallbacks: list[str] = []
    i = 0
    while i < len(patterns) and not extracted:
        priority = patterns[i][2]
        group = []
        while i < len(patterns) and patterns[i][2] == priority:
            group.append(patterns[i])
            i += 1
        matches = sorted(
            ((m, target) for pattern, target, _ in group for m in pattern.finditer(text)),
            key=lambda x: (x[0].end(), -x[0].start()),
            reverse=True,
        )
        for m, target in matches:
            if isinstance(target, LatexExtractionConfig):
                value, fallback = extract_latex(m, target)
            else:
                value, fallback = _extract_expr_safely(m)
            if fallback:
                fallbacks.append(fallback)
            if value is not None:
                extracted.append(value)
                break
    if fallbacks:
        extracted.append(fallbacks[0])
    return extracted


def _too_large(expr: Any) -> bool:
    """Whether comparing ``expr`` could make sympy build an astronomically large number."""
    if not isinstance(expr, sympy.Basic):
        return False
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.Pow) and node.base.is_number and node.exp.is_number:
            if node.exp.has(sympy.Pow, sympy.factorial, sympy.gamma):
                return True  # a tower: 9^(9^9)
            if node.exp.is_Integer and abs(int(node.exp)) > 1:
                base = node.base
                if base.is_Rational and base not in (0, 1, -1):
                    size = max(abs(int(base.p)), abs(int(base.q)))
                    if abs(int(node.exp)) * math.log10(size) > _MAX_DIGITS:
                        return True
                elif abs(int(node.exp)) > _MAX_DIGITS:
                    return True
        elif isinstance(node, (sympy.factorial, sympy.factorial2, sympy.gamma, sympy.binomial)):
            if any(a.is_Integer and abs(int(a)) > _MAX_FACTORIAL_ARG for a in node.args):
                return True
    return False


@lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> tuple | None:
    """Parse a gold answer (cached: a group of G completions shares one gold)."""
    text = gold.strip()
    if len(text) >= 2 and text.startswith("$") and text.endswith("$") and not text.endswith("\\$"):
        text = text.strip("$").strip()
    if "\\boxed" not in text and "\\fbox" not in text:
        text = _TRAILING_PERCENT_RE.sub("", text)
        text = f"\\boxed{{{text}}}"
    try:
        parsed = _extract(f"${text}$", _GOLD_CONFIG)
    except Exception:  # math-verify / latex2sympy internals: any failure means "cannot parse"
        log.debug("gold %r failed to parse", gold, exc_info=True)
        return None
    if not any(isinstance(p, (sympy.Basic, sympy.MatrixBase)) for p in parsed):
        return None
    if any(_too_large(p) for p in parsed):
        return None
    return tuple(parsed)


_warm_lock = threading.Lock()
_warmed = False


def _warm_up() -> None:
    """Pay math-verify's one-time set-up in this process now, once: compiling its extraction regexes for
    each of our configs, and the first LaTeX parses and sympy comparisons.

    Called when a :class:`MathVerifier` is built or unpickled (a reward worker process unpickles it while
    starting, before it reports ready), so the set-up is never inside the first *timed* reward call. There
    it counted against :class:`~grpolab.verifiers.reward.Verifier`'s per-call ``timeout_s`` (about 0.1 s of
    CPU, many times that on a loaded machine): the first completion of a process, and the first after each
    worker restart, could be cut as a timeout although its answer is plain.
    """
    global _warmed
    with _warm_lock:
        if _warmed:
            return
        try:
            for configs in (_GOLD_CONFIG, _BOX_CONFIG, _PRED_CONFIG):
                get_extraction_regexes(configs)
            for gold, pred, configs in (
                (r"\frac{1}{2}", r"$\boxed{0.5}$", _BOX_CONFIG),
                ("x^2+1", r"$\boxed{x^{2}+1}$", _BOX_CONFIG),
                ("3", "so x = 3/1", _PRED_CONFIG),
            ):
                verify(list(_parse_gold(gold) or ()), _extract(pred, configs), timeout_seconds=None)
        except Exception:  # a failed warm-up only leaves the set-up to the first call
            log.debug("math-verify warm-up failed", exc_info=True)
        _warmed = True


def _normalize_box(content: str) -> str:
    """Canonical text of a boxed answer: trailing sentence period and percent sign dropped."""
    content = _TRAILING_PERIOD_RE.sub("", content.strip())
    return _TRAILING_PERCENT_RE.sub("", content).strip()


# ------------------------------------------------------------------------------------------ verifier
class MathVerifier:
    """Reward 1.0 when the completion's final answer is mathematically equal to the gold, else 0.0.

    A TRL-style reward function: ``verifier(completions, answer=golds) -> list[float | None]``.

    Args:
        float_rounding: decimals kept when comparing floats (math-verify's default 6: ``0.33`` is not
            ``1/3``, ``0.333333`` is).
        numeric_precision: significant digits for numeric evaluation.
        strict: math-verify's strict mode (variables matter).
        reject_hedges: score 0 when the final answer is several boxes joined by "or"/commas (a hedge) that
            are not all equal to the gold; false grades only the last of them. An earlier box followed by
            other text is a superseded answer either way: the last box counts.

    Example:
        >>> MathVerifier()(["so $\\\\boxed{\\\\dfrac{3}{4}}$", "$\\\\boxed{0.75}$"], answer=["\\\\frac34", "0.7"])
        [1.0, 0.0]
    """

    name = "math"

    def __init__(
        self,
        float_rounding: int = 6,
        numeric_precision: int = 15,
        strict: bool = True,
        reject_hedges: bool = True,
    ) -> None:
        self.float_rounding = float_rounding
        self.numeric_precision = numeric_precision
        self.strict = strict
        self.reject_hedges = reject_hedges
        _warm_up()

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        _warm_up()  # in a reward worker process: while it starts, outside the per-call time limit

    def parse_gold(self, answer: str) -> tuple | None:
        """The parsed gold (math-verify objects), or ``None`` if it cannot be parsed."""
        if answer is None or not str(answer).strip():
            return None
        return _parse_gold(str(answer))

    def gold_is_scorable(self, answer: str) -> bool:
        """Whether this verifier can score completions against ``answer``."""
        return self.parse_gold(answer) is not None

    def _equal(self, gold: tuple, pred: list) -> bool:
        if not pred or any(_too_large(p) for p in pred):
            return False
        return verify(
            list(gold),
            pred,
            float_rounding=self.float_rounding,
            numeric_precision=self.numeric_precision,
            strict=self.strict,
            timeout_seconds=None,
        )

    def score(self, completion: str, gold_text: str) -> float | None:
        """Score one completion; ``None`` if the gold is unparseable. Never raises on model output."""
        gold = self.parse_gold(gold_text)
        if gold is None:
            return None
        region = final_answer_region(completion)
        if not region.strip():
            return 0.0
        try:
            boxes = list(dict.fromkeys(_normalize_box(b) for b in final_boxed_contents(region)))
            boxes = [b for b in boxes if b]
            if boxes:
                if not self.reject_hedges:
                    boxes = boxes[-1:]
                for box in boxes:  # every distinct box must be right: a hedge scores 0
                    if not self._equal(gold, _extract(f"$\\boxed{{{box}}}$", _BOX_CONFIG)):
                        return 0.0
                return 1.0
            return 1.0 if self._equal(gold, _extract(region, _PRED_CONFIG)) else 0.0
        except Exception:  # sympy/latex2sympy can fail in many ways on odd output: that is a wrong answer
            log.debug("math verifier failed on a completion", exc_info=True)
            return 0.0

    def __call__(self, completions: list[str], answer: list[str], **kwargs) -> list[float | None]:
        """Score each completion against its gold.

        Args:
            completions: decoded completions (text only).
            answer: gold answers in LaTeX (MATH's ``answer`` column), aligned with ``completions``.
            **kwargs: other dataset columns; ignored.

        Returns:
            1.0 / 0.0 per completion, ``None`` where the gold cannot be parsed (unscorable).

        Raises:
            ValueError: if ``completions`` and ``answer`` differ in length.
        """
        if len(completions) != len(answer):
            raise ValueError(f"math verifier: {len(completions)} completions but {len(answer)} answers")
        return [self.score(c, a) for c, a in zip(completions, answer, strict=True)]
