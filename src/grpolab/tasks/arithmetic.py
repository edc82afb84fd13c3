"""A seeded synthetic verifiable task: integer addition (and optionally subtraction/multiplication).

This is the embedded default task: it needs no download, its gold answers are exact, and a tiny
character-level model learns it in minutes on a CPU. Prompts look like ``"37+45="`` and the gold answer
is ``"82"``.
"""

from __future__ import annotations

import itertools

from grpolab.tasks.base import Row, Task


class ArithmeticTask(Task):
    """All ``a <op> b`` problems with operands in ``[min_value, max_value]``, shuffled by ``seed``.

    Train, validation and test prompts are disjoint by construction (each problem appears once).

    Args:
        operations: string of operators to draw from, a subset of ``"+-*"``.
        min_value: smallest operand (inclusive, >= 0).
        max_value: largest operand (inclusive).
        num_train: cap on the number of training rows (None = all that are left after val/test).
        **kwargs: :class:`~grpolab.tasks.base.Task` arguments (``val_size``, ``test_size``, ``seed``...).

    Raises:
        ValueError: on an unknown operator, a negative or empty operand range, or too few problems.
    """

    name = "arithmetic"

    def __init__(
        self,
        operations: str = "+",
        min_value: int = 0,
        max_value: int = 99,
        num_train: int | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if not operations or set(operations) - set("+-*"):
            raise ValueError(f"data.operations must be a non-empty subset of '+-*', got {operations!r}")
        if min_value < 0 or max_value < min_value:
            raise ValueError(f"data.min_value/max_value must satisfy 0 <= min <= max, got {min_value}, {max_value}")
        if num_train is not None and num_train <= 0:
            raise ValueError(f"data.num_train must be positive or null, got {num_train}")
        self.operations = operations
        self.min_value = min_value
        self.max_value = max_value
        self.num_train = num_train

    def load_rows(self) -> list[Row]:
        values = range(self.min_value, self.max_value + 1)
        rows = []
        for op, a, b in itertools.product(self.operations, values, values):
            value = {"+": a + b, "-": a - b, "*": a * b}[op]
            rows.append({"uid": f"arith/{a}{op}{b}", "prompt": f"{a}{op}{b}=", "answer": str(value)})
        needed = self.val_size + self.test_size + 1
        if len(rows) < needed:
            raise ValueError(
                f"arithmetic: only {len(rows)} problems in [{self.min_value}, {self.max_value}], "
                f"need more than val_size + test_size = {needed - 1}"
            )
        return rows

    def splits(self) -> dict[str, list[Row]]:
        splits = super().splits()
        if self.num_train is not None:
            splits["train"] = splits["train"][: self.num_train]
        return splits

