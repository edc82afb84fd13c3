"""The order in which training prompts are drawn: seeded, without replacement within an epoch."""

from __future__ import annotations

from typing import Any

import torch


def check_split_sizes(task_name: str, splits: dict[str, list], cfg: Any, world: int = 1) -> None:
    """Refuse splits too small to train on: one step needs ``prompts_per_step x world`` distinct training prompts,
    and validation needs held-out rows.

    Raises:
        ValueError: naming the keys that change the sizes.
    """
    need = cfg.prompts_per_step * world
    if len(splits["train"]) < need:
        raise ValueError(
            f"{task_name}: the training split has {len(splits['train'])} usable rows, fewer than the {need} distinct "
            f"prompts one step needs (algo.per_device_train_batch_size={cfg.per_device_train_batch_size} / "
            f"algo.num_generations={cfg.num_generations}" + (f" x {world} processes" if world > 1 else "")
            + "); add rows, lower data.val_size / data.test_size, or lower algo.per_device_train_batch_size")
    if not splits["val"]:
        raise ValueError("data.val_size is 0: validation needs held-out prompts")


class PromptOrder:
    """Endless, seeded sampling of training prompts without replacement within an epoch.

    Its state (epoch and position) goes into the checkpoint so a resumed run draws the same prompts.
    """

    def __init__(self, num_rows: int, seed: int) -> None:
        if num_rows < 1:
            raise ValueError("data: the training split has no rows")
        self.num_rows = num_rows
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.num_rows, generator=g).tolist()

    def take(self, n: int) -> list[int]:
        """The next ``n`` row indices (crossing epoch boundaries as needed)."""
        out = []
        while len(out) < n:
            if self.position >= self.num_rows:
                self.epoch += 1
                self.position = 0
                self._order = self._permutation()
            take = min(n - len(out), self.num_rows - self.position)
            out.extend(self._order[self.position:self.position + take])
            self.position += take
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation()
