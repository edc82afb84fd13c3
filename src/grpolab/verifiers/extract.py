"""Text helpers shared by the verifiers: the final-answer region, boxed answers and plain numbers.

Everything here is string processing with linear-time regular expressions; nothing evaluates model
output. The rules:

- **Reasoning is not the answer.** Text inside ``<think>...</think>`` never counts. When a completion
  closes a think block, only the text after the last ``</think>`` is the final-answer region; when it
  opens one and never closes it (ran out of tokens mid-thought), the region is empty.
- **``<answer>`` tags narrow the region.** If the region holds ``<answer>...</answer>`` (or an
  unclosed ``<answer>``), the content of the last one is the region.
- **Boxes are balanced.** ``\\boxed{...}`` / ``\\fbox{...}`` contents are read with brace counting
  (``\\boxed{\\frac{1}{2}}`` is ``\\frac{1}{2}``); an unclosed box (truncated output) is ignored.
- **The last final answer counts.** A completion that boxes an answer, reasons on and boxes another (a
  correction) is graded on its last box (:func:`final_boxed_contents`), as every public grader does:
  math-verify tries the right-most match first (``math_verify/parser.py``: matches sorted by end position,
  reversed), Qwen2.5-Math takes ``pred_str.split("boxed")[-1]`` (``evaluation/parser.py``), verl's gsm8k
  reward takes ``solutions[-1]`` of its ``#### N`` matches and hendrycks' ``last_boxed_only_string`` the
  last box. Boxes joined only by "or" / commas (``\\boxed{3} or \\boxed{5}``) are one hedged answer:
  the caller gets them all and scores 0 unless all agree (the math-verify-based graders' verdict).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")

# A number as written in prose: optional sign (only when the '-' is not a binary minus, i.e. not
# preceded by a word character or a closing bracket), thousands groups or plain digits, optional
# decimals. ``(?<![\d.])`` keeps "180" from yielding "80" and ".5" from yielding "5".
_NUMBER_RE = re.compile(
    r"(?P<sign>(?<![\w)\]}])-)?(?<![\d.])(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?P<frac>\.\d+)?"
)


def final_answer_region(text: str) -> str:
    """Return the part of a completion where the final answer lives.

    Args:
        text: a decoded completion.

    Returns:
        The text after the last ``</think>`` (or all of it when there is no think block; an empty
        string when a ``<think>`` is never closed), narrowed to the content of the last
        ``<answer>`` block when there is one.

    Examples:
        >>> final_answer_region("<think>maybe 7</think>The answer is 18.")
        'The answer is 18.'
        >>> final_answer_region("<think>still thinking about 7")
        ''
        >>> final_answer_region("<think>x</think><answer> 18 </answer>")
        ' 18 '
    """
    close = text.rfind(THINK_CLOSE)
    if close >= 0:
        region = text[close + len(THINK_CLOSE) :]
    elif THINK_OPEN in text:
        return ""
    else:
        region = text
    start = region.rfind(ANSWER_OPEN)
    if start >= 0:
        region = region[start + len(ANSWER_OPEN) :]
        end = region.find(ANSWER_CLOSE)
        if end >= 0:
            region = region[:end]
    return region


def boxed_contents(text: str) -> list[str]:
    """Return the contents of every closed ``\\boxed{...}`` / ``\\fbox{...}`` in order.

    Empty boxes (``\\boxed{}``, e.g. an echoed instruction) are skipped; an unclosed box is ignored.

    Examples:
        >>> boxed_contents(r"so $\\boxed{\\frac{1}{2}}$ or \\boxed{3}, not \\boxed{}")
        ['\\\\frac{1}{2}', '3']
    """
    return [content for _, _, content in boxed_spans(text)]


# What may stand between two boxes that together are one (hedged) answer: "or", "either", commas,
# semicolons, slashes, math delimiters and spaces. Any other word (a correction: "Wait, that is wrong")
# separates two answers, and then the later one counts.
_HEDGE_JOINER_RE = re.compile(r"(?:[\s$,;/.()\[\]\\]|\bor\b|\beither\b)*", re.IGNORECASE)


def final_boxed_contents(text: str) -> list[str]:
    """The contents of the last box, together with the boxes hedged with it (joined by "or"/commas only).

    Returns:
        ``[]`` without a closed box; ``[last]`` for a single final answer (earlier boxes separated from it
        by other text are superseded corrections); several items for a hedge.

    Examples:
        >>> final_boxed_contents(r"\\boxed{3}. Wait, I dropped a term: \\boxed{5}.")
        ['5']
        >>> final_boxed_contents(r"either $\\boxed{3}$ or $\\boxed{5}$")
        ['3', '5']
    """
    spans = boxed_spans(text)
    if not spans:
        return []
    first = len(spans) - 1
    while first > 0 and _HEDGE_JOINER_RE.fullmatch(text[spans[first - 1][1] : spans[first][0]]):
        first -= 1
    return [content for _, _, content in spans[first:]]


def boxed_spans(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, content)`` of every closed, non-empty box, in order (see :func:`boxed_contents`)."""
    out: list[tuple[int, int, str]] = []
    pos = 0
    while True:
        m = _BOX_RE.search(text, pos)
        if m is None:
            return out
        depth, i = 1, m.end()
        while i < len(text) and depth:
            ch = text[i]
            if ch == "\\" and i + 1 < len(text):
                i += 2  # skip escaped characters such as \{ and \}
                continue
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            i += 1
        if depth:
            return out  # unclosed: truncated output, nothing after it can be closed either
        content = text[m.end() : i - 1]
        if content.strip():
            out.append((m.start(), i, content))
        pos = i


def find_numbers(text: str) -> list[str]:
    """Return the numbers written in ``text``, in order, as they appear (commas kept).

    ``$`` signs, LaTeX ``\\$`` and the Unicode minus are handled by :func:`normalize_number`;
    a ``-`` counts as a sign only when it is not a binary minus (``10-3`` gives ``10`` and ``3``).

    Examples:
        >>> find_numbers("5 - 8 = -3, then $1,000.50 and 10-3")
        ['5', '8', '-3', '1,000.50', '10', '3']
    """
    text = text.replace("\u2212", "-").replace("\\$", " ").replace("$", " ")
    return [m.group(0) for m in _NUMBER_RE.finditer(text)]


def normalize_number(text: str) -> Decimal | None:
    """Parse a number written as text into an exact :class:`~decimal.Decimal`.

    Accepts an optional sign, ``$`` / ``\\$``, thousands commas, a trailing period and trailing zeros
    (``"$1,000.00."`` is 1000). Comparison is exact (no float rounding, so ``10000000000000001`` is not
    ``10000000000000000``).

    Returns:
        The value, or ``None`` when ``text`` is not exactly one number.

    Examples:
        >>> normalize_number(" $2,125. ") == 2125
        True
        >>> normalize_number("18.00") == normalize_number("18")
        True
        >>> normalize_number("18 apples") is None
        True
    """
    s = text.replace("\u2212", "-").replace("\\$", "").replace("$", "").strip()
    s = s.rstrip(".").removeprefix("+")
    m = _NUMBER_RE.fullmatch(s)
    if m is None:
        return None
    try:
        return Decimal(s.replace(",", ""))
    except InvalidOperation:  # pragma: no cover - the regex only admits valid literals
        return None
