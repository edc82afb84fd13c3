"""GSM8K answer checking: one number, compared exactly.

The completion is first cut at the first stop string (``"Question:"`` by default: lm-evaluation-harness'
gsm8k task stops generation there, ``generation_kwargs.until``), so a model that answers and then writes a
new few-shot question is graded on its answer, not on the continuation. Then, inside the final-answer
region (outside any ``<think>`` block, inside ``<answer>`` tags when present; see
:mod:`grpolab.verifiers.extract`), the model's answer is, in order of preference:

1. the first number after the *last* ``####`` (GSM8K's own marker; ``####18`` works too). The last final
   answer counts, so a correction wins over the answer it corrects, as in verl's gsm8k reward
   (``verl/utils/reward_score/gsm8k.py``: ``solutions = re.findall("#### ...")``, "take the last
   solution", ``solutions[-1]``);
2. otherwise the number in the last ``\\boxed{...}`` (Qwen2.5-Math ``evaluation/parser.py`` takes
   ``split("boxed")[-1]``); boxes joined only by "or"/commas are a hedge and score 0 unless they agree;
3. otherwise the last number of the region (lm-eval's ``flexible-extract``, ``group_select: -1``; verl's
   ``method="flexible"``), but only for a completion that stopped: one cut off by the length limit
   (``truncated`` column) before any marker has not given an answer, and with ``strict_marker`` no
   completion gets this fallback (verl's default ``method="strict"``).

Both sides are normalised the same way (commas, ``$``, a trailing period, trailing zeros, the Unicode
minus) and compared as exact decimals, so ``18`` in ``180`` never counts and big integers never round.
"""

from __future__ import annotations

import re
from decimal import Decimal

from grpolab.verifiers.extract import (
    final_answer_region,
    final_boxed_contents,
    find_numbers,
    normalize_number,
)

_HASH_RE = re.compile(r"####")


class GSM8KVerifier:
    """Reward 1.0 when the completion's final number equals the gold number, else 0.0.

    A TRL-style reward function: ``verifier(completions, answer=golds) -> list[float | None]``.

    Args:
        strict_marker: if true, only an answer after ``####`` (or in a box) counts; a completion without
            one scores 0 instead of falling back to its last number. A truncated completion never gets
            the fallback, whatever this says.
        stop_strings: the completion is cut at the first occurrence of any of these before grading
            (lm-eval's ``until`` for gsm8k); ``None`` or ``[]`` cuts nothing.

    Example:
        >>> GSM8KVerifier()(["9 * 2 = 18\\n#### 18", "#### 180"], answer=["18", "18"])
        [1.0, 0.0]
        >>> GSM8KVerifier()(["so far 9 * 2 = 18", "so far 9 * 2 = 18"], answer=["18", "18"], truncated=[True, False])
        [0.0, 1.0]
    """

    name = "gsm8k"

    def __init__(self, strict_marker: bool = False, stop_strings: list[str] | tuple[str, ...] | None = ("Question:",)) -> None:
        self.strict_marker = strict_marker
        self.stop_strings = tuple(s for s in (stop_strings or ()) if s)

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

    def extract(self, completion: str, truncated: bool = False) -> Decimal | None:
        """The model's answer as an exact decimal, or ``None`` when it gave none (or hedged).

        Args:
            completion: the decoded completion.
            truncated: whether it hit the length limit without a stop token (then no last-number
                fallback: an unfinished reasoning's last number is not an answer).

        Never raises on any string.
        """
        for stop in self.stop_strings:
            cut = completion.find(stop)
            if cut >= 0:
                completion = completion[:cut]
        region = final_answer_region(completion)
        markers = list(_HASH_RE.finditer(region))
        if markers:
            numbers = find_numbers(region[markers[-1].end() :])
            return normalize_number(numbers[0]) if numbers else None
        boxes = final_boxed_contents(region)
        if boxes:
            values = set()
            for box in boxes:
                numbers = find_numbers(box)
                values.add(normalize_number(numbers[-1]) if numbers else None)
            return values.pop() if len(values) == 1 else None
        if self.strict_marker or truncated:
            return None
        numbers = find_numbers(region)
        return normalize_number(numbers[-1]) if numbers else None

    def __call__(
        self, completions: list[str], answer: list[str], truncated: list[bool] | None = None, **kwargs
    ) -> list[float | None]:
        """Score each completion against its gold.

        Args:
            completions: decoded completions (text only).
            answer: gold answers, aligned with ``completions`` (GSM8K text after ``####`` or a full
                GSM8K solution ending in ``#### N``).
            truncated: per completion, whether it hit the length limit without stopping (the trainer
                passes this column); ``None`` treats every completion as stopped.
            **kwargs: other dataset columns; ignored.

        Returns:
            1.0 / 0.0 per completion, ``None`` where the gold is not a number (unscorable).

        Raises:
            ValueError: if ``completions`` and ``answer`` differ in length.
        """
        if len(completions) != len(answer):
            raise ValueError(f"gsm8k verifier: {len(completions)} completions but {len(answer)} answers")
        if truncated is None:
            truncated = [False] * len(completions)
        out: list[float | None] = []
        for completion, gold_text, cut in zip(completions, answer, truncated, strict=True):
            gold = self.parse_gold(gold_text)
            if gold is None:
                out.append(None)
                continue
            pred = self.extract(completion, truncated=bool(cut))
            out.append(1.0 if pred is not None and pred == gold else 0.0)
        return out
