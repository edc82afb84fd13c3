"""Competition-math tasks with LaTeX answers: MATH-500, DeepScaleR, and any file with problem/answer columns.

- ``math500``: ``HuggingFaceH4/MATH-500`` (split ``test``, 500 rows; ``problem``, ``solution``,
  ``answer``, ``subject``, ``level``, ``unique_id``), or the same rows from a local file
  (``../shared/data/math500/test.jsonl``). An evaluation set: the paper evaluates on it.
- ``deepscaler``: ``agentica-org/DeepScaleR-Preview-Dataset`` (split ``train``, ~40k rows; ``problem``,
  ``answer``, ``solution``), the paper's training set for DeepSeek-R1-Distill-Qwen-1.5B.

The gold is the ``answer`` column as written (LaTeX); the math verifier wraps and parses it.
"""

from __future__ import annotations

from typing import Any

from grpolab.tasks.base import Row, Task
from grpolab.tasks.loading import RESERVED_COLUMNS, check_keys, extra_columns, load_records

MATH_INSTRUCTION = "{prompt}\nPlease reason step by step, and put your final answer within \\boxed{{}}."


class MathTask(Task):
    """Rows ``uid`` (``<name>/<split>/<index>``), ``prompt`` (the problem), ``answer`` (the LaTeX gold),
    plus the source's other columns (``solution``, ``subject``, ``level``, ``unique_id``, ...).

    The source's rows are the training source; val and test are carved from them with
    ``val_size``/``test_size`` unless ``test_path`` or ``test_split`` names a separate test source.

    Args:
        name: task name, used in uids and messages (``math500``, ``deepscaler``).
        hub_id: hub dataset id, used when ``path`` is null.
        split: hub split to load.
        hub_config: hub dataset config, if it has several.
        path: a local ``.jsonl``/``.json``/``.parquet`` file; when given, the hub is not used.
        test_path: an optional local file used as the test split.
        test_split: an optional hub split used as the test split.
        problem_key: column holding the problem.
        answer_key: column holding the final answer.
        **kwargs: :class:`~grpolab.tasks.base.Task` arguments (``val_size``, ``test_size``, ``seed``,
            ``system_prompt``, ``instruction``, ``use_chat_template``, ``chat_template_kwargs``).
    """

    def __init__(
        self,
        name: str = "math500",
        hub_id: str | None = "HuggingFaceH4/MATH-500",
        split: str = "test",
        hub_config: str | None = None,
        path: str | None = None,
        test_path: str | None = None,
        test_split: str | None = None,
        problem_key: str = "problem",
        answer_key: str = "answer",
        instruction: str = MATH_INSTRUCTION,
        **kwargs: Any,
    ) -> None:
        super().__init__(instruction=instruction, **kwargs)
        self.name = name
        self.hub_id = hub_id
        self.split = split
        self.hub_config = hub_config
        self.path = path
        self.test_path = test_path
        self.test_split = test_split
        self.problem_key = problem_key
        self.answer_key = answer_key

    def _rows(self, path: str | None, split: str) -> list[Row]:
        records, source = load_records(path, self.hub_id, self.hub_config, split)
        check_keys(records, [self.problem_key, self.answer_key], source)
        rows: list[Row] = []
        for i, rec in enumerate(records):
            row: Row = {
                "uid": f"{self.name}/{split}/{i}",
                "prompt": str(rec[self.problem_key]),
                "answer": str(rec[self.answer_key]).strip(),
            }
            row.update(extra_columns(rec, [self.problem_key, self.answer_key], RESERVED_COLUMNS))
            rows.append(row)
        return rows

    def load_rows(self) -> dict[str, list[Row]]:
        """Train (and test, when a test source is configured) rows.

        Raises:
            FileNotFoundError: if ``path`` or ``test_path`` does not exist.
            ValueError: on an empty file or split, a misspelt key (lists the columns) or a row with a
                missing or empty problem/answer (names the source, row and key).
        """
        out = {"train": self._rows(self.path, "train" if self.path else self.split)}
        if self.test_path:
            out["test"] = self._rows(self.test_path, "test")
        elif not self.path and self.test_split:
            out["test"] = self._rows(None, self.test_split)
        return out
