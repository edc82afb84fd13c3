"""A test-only Lightning callback for the multi-process runs: what each rank trained on, and its weights."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch

from grpolab.distributed import is_sharded, iter_full_parameters


class RankAudit(L.Callback):
    """Appends ``{"rank", "step", "uids"}`` per training step to ``<out>/rank<r>.jsonl`` and saves the
    policy's final full parameters (gathered module by module, so also under FSDP) to ``<out>/rank<r>.pt``."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        row = {"rank": trainer.global_rank, "step": trainer.global_step, "uids": batch.info["uids"]}
        with (self.out / f"rank{trainer.global_rank}.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")

    def on_train_end(self, trainer, pl_module) -> None:
        state = {k: v.cpu().clone() for k, v in iter_full_parameters(pl_module.policy)}
        torch.save(state, self.out / f"rank{trainer.global_rank}.pt")
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps({"sharded": is_sharded(pl_module.policy)}))
