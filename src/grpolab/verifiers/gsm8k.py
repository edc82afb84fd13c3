"""GSM8K answer checking: one number, compared exactly.

Which number is the model's answer, in order of preference, inside the final-answer region (outside any
``<think>`` block, inside ``<answer>`` tags when present; see :mod:`grpolab.verifiers.extract`):

1. the first number after the first ``####`` (GSM8K's own marker; ``####18`` works too). The *first*
   marker wins so that a model that keeps generating a new few-shot question after answering is graded
   on its answer, not on the continuation;
2. otherwise the number in ``\\boxed{...}``; several boxes with different numbers are a hedge and score 0;
3. otherwise the last number of the region.

Both sides are normalised the same way (commas, ``$``, a trailing period, trailing zeros, the Unicode
minus) and compared as exact decimals, so ``18`` in ``180`` never counts and big integers never round.
"""

from __future__ import annotations

import re
from decimal import Decimal

from grpolab.verifiers.extract import boxed_contents, final_answer_region, find_numbers, normalize_number

_HASH_RE = re.compile(r"####")


class GSM8KVerifier:
    """Reward 1.0 when the completion's final number equals the gold number, else 0.0.

    A TRL-style reward function: ``verifier(completions, answer=golds) -> list[float | None]``.

    Args:
        strict_marker: if true, only an answer after ``####`` (or in a box) counts; a completion without
            one scores 0 instead of falling back to its last number.

    Example:
        >>> GSM8KVerifier()(["9 * 2 = 18\\n#### 18", "#### 180"], answer=["18", "18"])
        [1.0, 0.0]
    """

    name = "gsm8k"

    def __init__(self, strict_marker: bool = False) -> None:
        self.strict_marker = strict_marker

    def parse_gold(self, answer: str) -> Decimal | None:
        """The gold number, or ``None`` if ``answer`` is not exactly one number (after ``####`` if any)."""
        if answer is None:
            return None
        text = str(answer)
        if "####" in text:
            text = text.split("####")[-1]
        return normalize_number(text)

    def gold_is_scorable(self, answer: str) -> bool:
        """Whether this verifier can score completions against ``answer``."""
        return self.parse_gold(answer) is not None

    def extract(self, completion: str) -> Decimal | None:
        """The model's answer as an exact decimal, or ``None`` when it gave none (or hedged).

        Never raises on any string.
        """
        region = final_answer_region(completion)
        m = _HASH_RE.search(region)
        if m is not None:
            after = region[m.end() :]
            nxt = _HASH_RE.search(after)
            if nxt is not None:
                after = after[: nxt.start()]
            numbers = find_numbers(after)
            return normalize_number(numbers[0]) if numbers else None
        boxes = boxed_contents(region)
        if boxes:
            values = set()
            for box in boxes:
                numbers = find_numbers(box)
                values.add(normalize_number(numbers[-1]) if numbers else None)
            return values.pop() if len(values) == 1 else None
        if self.strict_marker:
            return None
        numbers = find_numbers(region)
        return normalize_number(numbers[-1]) if numbers else None

    def __call__(self, completions: list[str], answer: list[str], **kwargs) -> list[float | None]:
        """Score each completion against its gold.

        Args:
            completions: decoded completions (text only).
            answer: gold answers, aligned with ``completions`` (GSM8K text after ``####`` or a full
                GSM8K solution ending in ``#### N``).
            **kwargs: other dataset columns; ignored.

        Returns:
            1.0 / 0.0 per completion, ``None`` where the gold is not a number (unscorable).

        Raises:
            ValueError: if ``completions`` and ``answer`` differ in length.
        """
        if len(completions) != len(answer):
            raise ValueError(f"gsm8k verifier: {len(completions)} completions but {len(answer)} answers")
        out: list[float | None] = []
        for completion, gold_text in zip(completions, answer, strict=True):
            gold = self.parse_gold(gold_text)
            if gold is None:
                out.append(None)
                continue
            pred = self.extract(completion)
            out.append(1.0 if pred is not None and pred == gold else 0.0)
        return out
