"""A test-only Lightning callback for the multi-process runs: what each rank trained on, and its weights."""

from __future__ import annotations

import json
import os
from pathlib import Path

import lightning as L
import torch

from grpolab.distributed import is_sharded, iter_full_parameters


class RankAudit(L.Callback):
    """Appends ``{"rank", "step", "uids", "allreduces", "rewards", "lengths", "tokens"}`` per training step to
    ``<out>/rank<r>.jsonl``, writes the rank's rollout counters to ``<out>/rank<r>_counters.json`` and saves the
    policy's final full parameters (gathered module by module, so also under FSDP) to ``<out>/rank<r>.pt``."""

    def __init__(self, out: str, die_rank: int | None = None, die_at_step: int | None = None) -> None:
        self.out = Path(out)
        self.die_rank, self.die_at_step = die_rank, die_at_step  # fault injection: that rank's process exits

    def on_train_start(self, trainer, pl_module) -> None:
        self.allreduces = 0
        model = trainer.strategy.model
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):  # count DDP's gradient all-reduces
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            def counting_hook(state, bucket):
                self.allreduces += 1
                return allreduce_hook(None, bucket)

            model.register_comm_hook(None, counting_hook)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_rank == self.die_rank and trainer.global_step == self.die_at_step:
            os._exit(3)  # a hard crash (no exception, no cleanup), like an OOM kill

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        row = {"rank": trainer.global_rank, "step": trainer.global_step, "uids": batch.info["uids"],
               "allreduces": self.allreduces, "rewards": batch.rewards.tolist(),  # NaN = unscorable
               "lengths": batch.completion_mask.sum(1).tolist(),
               "tokens": int(batch.completion_mask.sum() + batch.prompt_mask.sum())}
        self.allreduces = 0
        with (self.out / f"rank{trainer.global_rank}.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")

    def on_validation_end(self, trainer, pl_module) -> None:
        self._write_counters(trainer)

    def _write_counters(self, trainer) -> None:
        """This rank's own rollout counters; rewritten after training and each validation, so the file holds their
        values when the run writes summary.json."""
        self.out.mkdir(parents=True, exist_ok=True)
        counters = dict(trainer.datamodule.producer.counters)
        (self.out / f"rank{trainer.global_rank}_counters.json").write_text(json.dumps(counters))

    def on_train_end(self, trainer, pl_module) -> None:
        self._write_counters(trainer)
        state = {k: v.cpu().clone() for k, v in iter_full_parameters(pl_module.policy)}
        torch.save(state, self.out / f"rank{trainer.global_rank}.pt")
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps({"sharded": is_sharded(pl_module.policy)}))
