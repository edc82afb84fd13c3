"""A seeded multi-step arithmetic task with longer completions: running sums of a chain of additions.

Prompts look like ``"3+5+7+2+8+1="`` and the gold completion writes every intermediate result, separated by
commas: ``"8,15,17,25,26"``. The reward is exact match of the whole chain (``verifier=exact``), so a completion
(about 13 tokens with the default six one-digit terms) is about four times as long as the addition task's and the sequence importance weight ``pi(y|x)/alpha(y|x)`` of a
stale sampler multiplies over more tokens (a task where the sampler's lag matters more). It uses the
tiny character model's vocabulary (digits, ``+``, ``-``, ``,``, ``=``) and warm-starts like the addition task:
each step is easy (add one digit), the chain is long, so the supervised warm start reaches the target sampled
accuracy of 0.25 in about 500 steps (1.5 CPU-minutes on one core; ``benchmarks/warmstart_multistep.py``).
"""

from __future__ import annotations

import random

from grpolab.tasks.base import Row, Task


def running_sums(terms: list[int], signs: list[str]) -> list[int]:
    """Partial results of ``terms[0] signs[0] terms[1] ...`` after each operation.

    Example:
        >>> running_sums([12, 34, 56, 7], ["+", "+", "-"])
        [46, 102, 95]
    """
    total, out = terms[0], []
    for sign, term in zip(signs, terms[1:]):
        total = total + term if sign == "+" else total - term
        out.append(total)
    return out


class MultiStepArithmeticTask(Task):
    """``num_terms`` operands in ``[min_value, max_value]`` joined by operators from ``operations``; the gold
    answer is the comma-separated running result (one number per operation).

    ``num_problems`` distinct problems are drawn with ``random.Random(generator_seed)`` (the problem set does not
    depend on ``seed``, which only shuffles the train/val/test split, as for the addition task).

    Args:
        num_terms: operands per problem, ``>= 2`` (``num_terms - 1`` steps in the answer).
        operations: subset of ``"+-"`` to draw each operator from (``-`` can make results negative).
        min_value: smallest operand (``>= 0``).
        max_value: largest operand.
        num_problems: distinct problems to generate (train + val + test).
        generator_seed: seed of the problem draw.
        **kwargs: :class:`~grpolab.tasks.base.Task` arguments (``val_size``, ``test_size``, ``seed``...).

    Raises:
        ValueError: naming the ``data.<key>`` at fault (bad operator, range, term count, too few problems).
    """

    name = "multistep"

    def __init__(self, num_terms: int = 6, operations: str = "+", min_value: int = 0, max_value: int = 9,
                 num_problems: int = 20000, generator_seed: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        if not operations or set(operations) - set("+-"):
            raise ValueError(f"data.operations must be a non-empty subset of '+-', got {operations!r}")
        if not (isinstance(num_terms, int) and num_terms >= 2):
            raise ValueError(f"data.num_terms must be an int >= 2, got {num_terms!r}")
        if min_value < 0 or max_value < min_value:
            raise ValueError(f"data.min_value/max_value must satisfy 0 <= min <= max, got {min_value}, {max_value}")
        space = (max_value - min_value + 1) ** num_terms * len(operations) ** (num_terms - 1)
        needed = self.val_size + self.test_size + 1
        if num_problems < needed or num_problems > space // 2:
            raise ValueError(f"data.num_problems must be in [{needed}, {space // 2}] (more than val_size + test_size, "
                             f"at most half of the {space} possible problems), got {num_problems}")
        self.num_terms = num_terms
        self.operations = operations
        self.min_value = min_value
        self.max_value = max_value
        self.num_problems = num_problems
        self.generator_seed = generator_seed

    def load_rows(self) -> list[Row]:
        rng = random.Random(self.generator_seed)
        rows, seen = [], set()
        while len(rows) < self.num_problems:
            terms = [rng.randint(self.min_value, self.max_value) for _ in range(self.num_terms)]
            signs = [rng.choice(self.operations) for _ in range(self.num_terms - 1)]
            prompt = str(terms[0]) + "".join(s + str(t) for s, t in zip(signs, terms[1:])) + "="
            if prompt in seen:
                continue
            seen.add(prompt)
            answer = ",".join(str(v) for v in running_sums(terms, signs))
            rows.append({"uid": f"multistep/{prompt[:-1]}", "prompt": prompt, "answer": answer})
        return rows
