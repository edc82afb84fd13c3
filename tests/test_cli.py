"""The real command line: `python src/train.py` as users run it, single run and Hydra multirun."""

import json
import subprocess
import sys

import pytest
from conftest import FAST_OVERRIDES, REPO_ROOT


@pytest.mark.slow
def test_multirun_over_algos_and_seeds(tmp_path):
    cmd = [sys.executable, "src/train.py", "-m", "algo=grpo_onpolicy,grpo_offpolicy", "seed=0,1",
           *FAST_OVERRIDES, "trainer.max_steps=2", "trainer.val_check_interval=2", "save_policy=false",
           f"hydra.sweep.dir={tmp_path}", f"paths.cache_dir={tmp_path / 'cache'}"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*/summary.json"))]
    assert sorted((s["algo"], s["seed"]) for s in summaries) == [
        ("grpo_offpolicy", 0), ("grpo_offpolicy", 1), ("grpo_onpolicy", 0), ("grpo_onpolicy", 1)]
    for s in summaries:
        assert s["steps"] == 2 and s["sampler_refreshes"] == (2 if s["algo"] == "grpo_onpolicy" else 1)
