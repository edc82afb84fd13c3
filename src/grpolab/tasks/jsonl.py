"""Any local JSONL / JSON / parquet file with a prompt column and an answer column."""

from __future__ import annotations

from typing import Any

from grpolab.tasks.base import Row, Task
from grpolab.tasks.loading import RESERVED_COLUMNS, check_keys, extra_columns, read_local


class JsonlTask(Task):
    """Rows from your own file: ``prompt`` from ``prompt_key``, ``answer`` from ``answer_key`` (as text),
    ``uid`` from ``uid_key`` (or ``<name>/<split>/<index>``), and every other column as is.

    Args:
        path: the training file (``.jsonl``, ``.json`` or ``.parquet``); val and, without ``test_path``,
            test are carved from it.
        prompt_key: column holding the problem text.
        answer_key: column holding the gold answer (numbers are turned into text).
        uid_key: optional column with a unique id per row (must be unique across train and test).
        test_path: optional test file with the same columns.
        name: task name, used in uids and messages.
        **kwargs: :class:`~grpolab.tasks.base.Task` arguments (``val_size``, ``test_size``, ``seed``,
            ``system_prompt``, ``instruction``, ``use_chat_template``, ``chat_template_kwargs``).

    Raises:
        ValueError: if ``path`` is missing.
    """

    def __init__(
        self,
        path: str | None = None,
        prompt_key: str = "prompt",
        answer_key: str = "answer",
        uid_key: str | None = None,
        test_path: str | None = None,
        name: str = "jsonl",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not path:
            raise ValueError("the jsonl task needs data.path (a .jsonl, .json or .parquet file)")
        self.path = path
        self.prompt_key = prompt_key
        self.answer_key = answer_key
        self.uid_key = uid_key
        self.test_path = test_path
        self.name = name

    def _rows(self, path: str, split: str) -> list[Row]:
        records = read_local(path)
        keys = [self.prompt_key, self.answer_key] + ([self.uid_key] if self.uid_key else [])
        check_keys(records, keys, str(path))
        rows: list[Row] = []
        for i, rec in enumerate(records):
            uid = str(rec[self.uid_key]) if self.uid_key else f"{self.name}/{split}/{i}"
            row: Row = {
                "uid": uid,
                "prompt": str(rec[self.prompt_key]),
                "answer": str(rec[self.answer_key]).strip(),
            }
            row.update(extra_columns(rec, keys, RESERVED_COLUMNS))
            rows.append(row)
        return rows

    def load_rows(self) -> dict[str, list[Row]]:
        """Train (and test, with ``test_path``) rows.

        Raises:
            FileNotFoundError: if a file does not exist.
            ValueError: on an empty file, a misspelt key (lists the columns), or a row with a missing or
                empty prompt/answer/uid (names the file, row and key).
        """
        out = {"train": self._rows(self.path, "train")}
        if self.test_path:
            out["test"] = self._rows(self.test_path, "test")
        return out
