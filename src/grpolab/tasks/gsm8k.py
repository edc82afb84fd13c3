"""GSM8K (Cobbe et al., 2021): grade-school word problems with one integer answer.

Source: the hub dataset ``openai/gsm8k`` (config ``main``, splits ``train``/``test``) or local
JSONL/parquet files with the same ``question``/``answer`` columns (``../shared/data/gsm8k``). The gold is
the text after ``####`` in the solution with thousands separators removed (93 golds are written
``#### 2,125``); the solution, with its calculator annotations ``<<48/2=24>>`` stripped, travels as the
``solution`` column.
"""

from __future__ import annotations

from typing import Any

from grpolab.tasks.base import Row, Task
from grpolab.tasks.loading import (
    RESERVED_COLUMNS,
    check_keys,
    extra_columns,
    load_records,
    strip_calculator_annotations,
)

GSM8K_INSTRUCTION = '{prompt}\nLet\'s think step by step and output the final answer after "####".'


def gsm8k_gold(solution: str) -> str | None:
    """The final answer of a GSM8K solution: the text after the last ``####``, commas removed.

    Returns:
        The gold as text, or ``None`` when the solution has no ``####`` or nothing after it.

    Examples:
        >>> gsm8k_gold("... so she pays $<<2*1000=2000>>2,000.\\n#### 2,000")
        '2000'
    """
    if "####" not in solution:
        return None
    gold = solution.rsplit("####", 1)[1].strip().replace(",", "")
    return gold or None


class GSM8KTask(Task):
    """GSM8K rows: ``uid`` (``gsm8k/<split>/<index>``), ``prompt`` (the question), ``answer`` (the gold
    number as text), ``solution`` (the reference solution without calculator annotations).

    Args:
        path: a local ``.jsonl``/``.json``/``.parquet`` file with ``question``/``answer`` columns; when
            given, the hub is not used. Its rows are the training source (val and, without ``test_path``,
            test are carved from it).
        test_path: an optional local test file (e.g. GSM8K's ``test.jsonl``); used as the test split
            (with ``path`` or with the hub's training split).
        hub_id: hub dataset id used when ``path`` is null.
        hub_config: hub dataset config.
        train_split: hub split for training (val is carved from it).
        test_split: hub split used as the test split (null: carve ``test_size`` rows from training).
        question_key: column holding the problem.
        answer_key: column holding the solution ending in ``#### <answer>``.
        **kwargs: :class:`~grpolab.tasks.base.Task` arguments (``val_size``, ``test_size``, ``seed``,
            ``system_prompt``, ``instruction``, ``use_chat_template``, ``chat_template_kwargs``).
    """

    name = "gsm8k"

    def __init__(
        self,
        path: str | None = None,
        test_path: str | None = None,
        hub_id: str = "openai/gsm8k",
        hub_config: str | None = "main",
        train_split: str = "train",
        test_split: str | None = "test",
        question_key: str = "question",
        answer_key: str = "answer",
        instruction: str = GSM8K_INSTRUCTION,
        **kwargs: Any,
    ) -> None:
        super().__init__(instruction=instruction, **kwargs)
        self.path = path
        self.test_path = test_path
        self.hub_id = hub_id
        self.hub_config = hub_config
        self.train_split = train_split
        self.test_split = test_split
        self.question_key = question_key
        self.answer_key = answer_key

    def _rows(self, path: str | None, split: str) -> list[Row]:
        records, source = load_records(path, self.hub_id, self.hub_config, split)
        check_keys(records, [self.question_key, self.answer_key], source)
        rows: list[Row] = []
        for i, rec in enumerate(records):
            solution = str(rec[self.answer_key])
            gold = gsm8k_gold(solution)
            if gold is None:
                raise ValueError(
                    f"{source}: row {i}: {self.answer_key!r} has no final answer after '####': {solution[-80:]!r}"
                )
            row: Row = {
                "uid": f"{self.name}/{split}/{i}",
                "prompt": str(rec[self.question_key]),
                "answer": gold,
            }
            row["solution"] = strip_calculator_annotations(solution)
            row.update(
                extra_columns(rec, [self.question_key, self.answer_key], RESERVED_COLUMNS + ("solution",))
            )
            rows.append(row)
        return rows

    def load_rows(self) -> dict[str, list[Row]]:
        """Train (and test, when a test source is configured) rows.

        Raises:
            FileNotFoundError: if ``path`` or ``test_path`` does not exist.
            ValueError: on an empty file, a misspelt key (lists the columns) or a row without a ``####``
                answer (names file, row and key).
        """
        out = {"train": self._rows(self.path, "train" if self.path else self.train_split)}
        if self.test_path:
            out["test"] = self._rows(self.test_path, "test")
        elif not self.path and self.test_split:
            out["test"] = self._rows(None, self.test_split)
        return out
