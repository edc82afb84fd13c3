"""2-process DDP training on the CPU (gloo), launched exactly as a user does: ``python src/train.py trainer=ddp``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import FAST_OVERRIDES, REPO_ROOT


def train(out: Path, *overrides: str, timeout: int = 150) -> subprocess.CompletedProcess:
    """Run src/train.py in a fresh process (Lightning re-launches it once per extra rank)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), str(Path(__file__).parent)]),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline",
           "GRPOLAB_CACHE": str(out / "cache")}
    cmd = [sys.executable, str(REPO_ROOT / "src" / "train.py"), *FAST_OVERRIDES, f"hydra.run.dir={out}", *overrides]
    return subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_two_process_ddp_trains_disjoint_whole_groups_and_keeps_ranks_identical(tmp_path):
    out = tmp_path / "run"
    steps, g = 3, 4
    res = train(out, "trainer=ddp", "trainer.devices=2", "algo.loss_type=dapo", f"trainer.max_steps={steps}",
                "algo.micro_batch_size=4", "algo.truncated_reward=-1.0", "algo.learning_rate=1e-3",
                f"algo.num_generations={g}", "+callbacks.audit._target_=rank_audit.RankAudit",
                f"+callbacks.audit.out={out / 'audit'}")
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == steps
    # only rank 0 writes the run folder (rank 1 logs to its own file and stops before the outputs)
    assert "summary:" in (out / "train.log").read_text()
    assert "summary:" not in (out / "train_ddp_process_1.log").read_text()
    rows = {r: [json.loads(x) for x in (out / "audit" / f"rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)}
    assert [len(rows[r]) for r in (0, 1)] == [steps, steps]
    for step in range(steps):
        uids = [rows[r][step]["uids"] for r in (0, 1)]
        # every group is whole on one rank (num_generations completions of each prompt) ...
        assert all(set(Counter(u).values()) == {g} for u in uids)
        # ... and the ranks sample disjoint prompts
        assert not set(uids[0]) & set(uids[1])
    seen = [set(u for row in rows[r] for u in row["uids"]) for r in (0, 1)]
    assert not seen[0] & seen[1]
    w0, w1 = (torch.load(out / "audit" / f"rank{r}.pt") for r in (0, 1))
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(out / "policy").state_dict()
    assert all(torch.equal(exported[k], w0[k]) for k in exported)
