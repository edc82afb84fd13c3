"""Format reward: does the completion follow the think/answer tag structure?

The whole completion is matched with :func:`re.fullmatch` (``re.DOTALL``, no ``re.MULTILINE``): the
classic bug of ``re.match(r"^<think>.*?</think><answer>.*?</answer>$", text, re.MULTILINE)`` accepts
any text after a newline that follows ``</answer>``, because ``$`` then matches at every line end and
``re.match`` anchors only the start. Here nothing but whitespace may follow the closing tag, and tags
may not repeat or nest (a non-greedy ``.*?`` under ``fullmatch`` would otherwise swallow
``</answer><answer>``).
"""

from __future__ import annotations

import re

_TAGS_RE = re.compile(r"</?(?:think|answer)>")
_MODES = {
    # R1-Zero style: <think> reasoning </think> <answer> answer </answer>
    "think_answer": re.compile(
        r"\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*", re.DOTALL
    ),
    # R1-Distill style: the chat template already opened <think>, so the completion may start inside it;
    # reasoning, </think>, then a non-empty final answer.
    "think": re.compile(r"\s*(?:<think>)?(?P<think>.*?)</think>(?P<answer>.*)", re.DOTALL),
}


class FormatVerifier:
    """Reward 1.0 when the completion has exactly the expected tag structure, else 0.0.

    A TRL-style reward function that ignores the gold: ``verifier(completions) -> list[float]``.

    Args:
        mode: ``"think_answer"`` (``<think>...</think><answer>...</answer>``, whitespace allowed
            between and around the blocks) or ``"think"`` (optional ``<think>``, reasoning, ``</think>``,
            then a final answer with no further tags).

    Raises:
        ValueError: on an unknown ``mode``.

    Example:
        >>> FormatVerifier()(["<think>2+2</think>\\n<answer>4</answer>", "<think>a</think><answer>4</answer>\\nmore"])
        [1.0, 0.0]
    """

    name = "format"

    def __init__(self, mode: str = "think_answer") -> None:
        if mode not in _MODES:
            raise ValueError(f"format verifier: mode must be one of {sorted(_MODES)}, got {mode!r}")
        self.mode = mode
        self._pattern = _MODES[mode]

    def gold_is_scorable(self, answer: str) -> bool:
        """Always true: the format reward does not use the gold."""
        return True

    def score(self, completion: str) -> float:
        """1.0 if ``completion`` has the expected structure, else 0.0. Never raises on a string."""
        m = self._pattern.fullmatch(completion)
        if m is None:
            return 0.0
        if _TAGS_RE.search(m.group("think")) or _TAGS_RE.search(m.group("answer")):
            return 0.0  # nested or repeated tags
        if not m.group("answer").strip():
            return 0.0
        return 1.0

    def __call__(
        self, completions: list[str], answer: list[str] | None = None, **kwargs
    ) -> list[float | None]:
        """Score each completion's structure.

        Args:
            completions: decoded completions (text only, special tokens removed).
            answer: gold answers; ignored.
            **kwargs: other dataset columns; ignored.

        Returns:
            1.0 / 0.0 per completion.
        """
        return [self.score(c) for c in completions]
