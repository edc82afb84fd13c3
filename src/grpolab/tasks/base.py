"""The task interface: where prompts and gold answers come from.

A task turns a data source into rows and rows into prompt text. A row is a plain ``dict`` with at
least ``uid`` (str, unique within the task; it keys the GRPO group), ``prompt`` (the raw problem
text, before any instruction or chat template) and ``answer`` (the gold answer as text). Any other
column travels with the row and is passed to the verifiers as a keyword list, so gold answers stay
aligned with their completions through every repeat, shuffle and split (docs/guide/pitfalls.md #2).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import Any

Row = dict[str, Any]

REQUIRED_COLUMNS = ("uid", "prompt", "answer")


class Task(ABC):
    """A verifiable task with seeded, disjoint train/val/test splits.

    Subclasses implement :meth:`load_rows` (all rows of the source, or a dict of source splits) and may
    override :meth:`format_prompt`. Splitting is done here, once, and cached.

    Args:
        val_size: number of held-out validation prompts taken from the training source.
        test_size: number of test prompts when the source has no test split of its own.
        seed: seed of the split (and of any synthetic generation).
        system_prompt: optional system message used with a chat template.
        instruction: format string applied to the raw problem; ``{prompt}`` is replaced by the problem.
        use_chat_template: ``"auto"`` uses the tokenizer's chat template when it has one; ``True``
            requires one; ``False`` never uses one.
        chat_template_kwargs: extra keyword arguments for ``tokenizer.apply_chat_template``.
    """

    name: str = "task"

    def __init__(
        self,
        val_size: int = 64,
        test_size: int = 256,
        seed: int = 0,
        system_prompt: str | None = None,
        instruction: str = "{prompt}",
        use_chat_template: bool | str = "auto",
        chat_template_kwargs: dict | None = None,
    ) -> None:
        if val_size < 0 or test_size < 0:
            raise ValueError(f"data.val_size and data.test_size must be >= 0, got {val_size}, {test_size}")
        if "{prompt}" not in instruction:
            raise ValueError(f"data.instruction must contain '{{prompt}}', got {instruction!r}")
        if use_chat_template not in (True, False, "auto"):
            raise ValueError(f"data.use_chat_template must be true, false or 'auto', got {use_chat_template!r}")
        self.val_size = val_size
        self.test_size = test_size
        self.seed = seed
        self.system_prompt = system_prompt
        self.instruction = instruction
        self.use_chat_template = use_chat_template
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._splits: dict[str, list[Row]] | None = None

    # ----------------------------------------------------------------------------------------- data
    @abstractmethod
    def load_rows(self) -> list[Row] | dict[str, list[Row]]:
        """Return the source rows: a list (split here into train/val/test) or a dict with ``train`` and
        optionally ``test`` (``val`` is always carved from ``train`` unless given)."""

    def splits(self) -> dict[str, list[Row]]:
        """The ``train``/``val``/``test`` rows, disjoint by ``uid``, deterministic in ``seed``.

        Raises:
            ValueError: if a row lacks a required column (the message names the row and the key), if
                uids repeat, or if a split would be empty.
        """
        if self._splits is not None:
            return self._splits
        source = self.load_rows()
        if isinstance(source, dict):
            train = list(source.get("train", []))
            test = list(source.get("test", []))
            val = list(source.get("val", []))
        else:
            train, test, val = list(source), [], []
        for split_name, rows in (("train", train), ("val", val), ("test", test)):
            validate_rows(rows, where=f"{self.name} {split_name}")
        rng = random.Random(self.seed)
        order = list(range(len(train)))
        rng.shuffle(order)
        train = [train[i] for i in order]
        if not val:
            val, train = train[: self.val_size], train[self.val_size :]
        if not test and self.test_size:
            test, train = train[: self.test_size], train[self.test_size :]
        if not train:
            raise ValueError(
                f"{self.name}: no training rows left after taking val_size={self.val_size} and "
                f"test_size={self.test_size}; lower data.val_size / data.test_size"
            )
        seen: dict[str, str] = {}
        for split_name, rows in (("train", train), ("val", val), ("test", test)):
            for row in rows:
                if row["uid"] in seen:
                    raise ValueError(
                        f"{self.name}: uid {row['uid']!r} appears in {seen[row['uid']]} and {split_name}"
                    )
                seen[row["uid"]] = split_name
        self._splits = {"train": train, "val": val, "test": test}
        return self._splits

    # -------------------------------------------------------------------------------------- prompts
    def format_prompt(self, row: Row, tokenizer: Any | None = None) -> str:
        """Build the text the policy continues: instruction, then the chat template when one is used.

        Args:
            row: a task row (needs ``prompt``).
            tokenizer: a Hugging Face tokenizer; its ``chat_template`` is used per ``use_chat_template``.

        Raises:
            ValueError: if ``use_chat_template`` is true and the tokenizer has no chat template.
        """
        text = self.instruction.format(prompt=row["prompt"])
        has_template = tokenizer is not None and getattr(tokenizer, "chat_template", None)
        if self.use_chat_template is True and not has_template:
            raise ValueError("data.use_chat_template is true but the tokenizer has no chat_template")
        if self.use_chat_template is False or not has_template:
            return text
        messages = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": text})
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs
        )


def validate_rows(rows: list[Row], where: str) -> None:
    """Check that every row has the required columns with non-empty values.

    Raises:
        ValueError: naming ``where``, the row number (0-based) and the missing key.
    """
    for i, row in enumerate(rows):
        for key in REQUIRED_COLUMNS:
            if key not in row:
                raise ValueError(f"{where}: row {i} has no {key!r} column (columns: {sorted(row)})")
            if row[key] is None or (isinstance(row[key], str) and not row[key].strip()):
                raise ValueError(f"{where}: row {i} has an empty {key!r}")
