"""Exact-match reward: the whole completion, whitespace-stripped, equals the gold."""

from __future__ import annotations


class ExactMatchVerifier:
    """Reward 1.0 when ``completion.strip() == answer.strip()``, else 0.0.

    Meant for synthetic tasks whose completions are the bare answer (e.g. arithmetic with a stop token);
    use :class:`~grpolab.verifiers.gsm8k.GSM8KVerifier` or :class:`~grpolab.verifiers.math.MathVerifier`
    for free-form reasoning.

    Args:
        case_sensitive: compare case-sensitively (default) or after ``str.casefold``.

    Example:
        >>> ExactMatchVerifier()([" 42\\n", "420"], answer=["42", "42"])
        [1.0, 0.0]
    """

    name = "exact"

    def __init__(self, case_sensitive: bool = True) -> None:
        self.case_sensitive = case_sensitive

    def gold_is_scorable(self, answer: str) -> bool:
        """Whether ``answer`` is a non-empty string."""
        return answer is not None and bool(str(answer).strip())

    def __call__(self, completions: list[str], answer: list[str], **kwargs) -> list[float | None]:
        """Score each completion against its gold.

        Args:
            completions: decoded completions (text only).
            answer: gold answers, aligned with ``completions``.
            **kwargs: other dataset columns; ignored.

        Returns:
            1.0 / 0.0 per completion; ``None`` where the gold is empty or missing (unscorable).

        Raises:
            ValueError: if ``completions`` and ``answer`` differ in length.
        """
        if len(completions) != len(answer):
            raise ValueError(f"exact verifier: {len(completions)} completions but {len(answer)} answers")
        out: list[float | None] = []
        for completion, gold in zip(completions, answer, strict=True):
            if not self.gold_is_scorable(gold):
                out.append(None)
                continue
            a, b = str(completion).strip(), str(gold).strip()
            if not self.case_sensitive:
                a, b = a.casefold(), b.casefold()
            out.append(1.0 if a == b else 0.0)
        return out
