"""2-process training on the CPU (gloo), launched as a user does: ``python src/train.py trainer=ddp|fsdp``."""

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
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="2 CPU processes need 2 cores")

STEPS, G = 3, 4
COMMON = ["trainer.devices=2", "algo.loss_type=dapo", f"trainer.max_steps={STEPS}", "algo.micro_batch_size=4",
          "algo.truncated_reward=-1.0", "algo.learning_rate=1e-3", f"algo.num_generations={G}", "algo.beta=0.04",
          "+callbacks.audit._target_=rank_audit.RankAudit"]


def train(out: Path, *overrides: str, timeout: int = 150) -> subprocess.CompletedProcess:
    """Run src/train.py in a fresh process (Lightning re-launches it once per extra rank)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), str(Path(__file__).parent)]),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline",
           "GRPOLAB_CACHE": str(out / "cache")}
    cmd = [sys.executable, str(REPO_ROOT / "src" / "train.py"), *FAST_OVERRIDES, f"hydra.run.dir={out}",
           f"+callbacks.audit.out={out / 'audit'}", *overrides]
    return subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _weights(out: Path, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(out / "audit" / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp") / "run"
    res = train(out, "trainer=ddp", *COMMON)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.mark.slow
def test_two_process_ddp_trains_disjoint_whole_groups_and_keeps_ranks_identical(ddp_run):
    out = ddp_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == STEPS
    # only rank 0 writes the run folder (rank 1 logs to its own file and stops before the outputs)
    assert "summary:" in (out / "train.log").read_text()
    assert "summary:" not in (out / "train_ddp_process_1.log").read_text()
    rows = {r: [json.loads(x) for x in (out / "audit" / f"rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)}
    assert [len(rows[r]) for r in (0, 1)] == [STEPS, STEPS]
    for step in range(STEPS):
        uids = [rows[r][step]["uids"] for r in (0, 1)]
        # every group is whole on one rank (num_generations completions of each prompt) ...
        assert all(set(Counter(u).values()) == {G} for u in uids)
        # ... and the ranks sample disjoint prompts
        assert not set(uids[0]) & set(uids[1])
    # 8 completions per rank in micro-batches of 4: DDP all-reduces the (one-bucket) gradient once per
    # optimizer step, after the last micro-batch (no_sync on the others)
    assert [row["allreduces"] for r in (0, 1) for row in rows[r]] == [1] * (2 * STEPS)
    seen = [set(u for row in rows[r] for u in row["uids"]) for r in (0, 1)]
    assert not seen[0] & seen[1]
    w0, w1 = _weights(out, 0), _weights(out, 1)
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    assert not json.loads((out / "audit" / "rank0.json").read_text())["sharded"]
    exported = AutoModelForCausalLM.from_pretrained(out / "policy").state_dict()
    assert all(torch.equal(exported[k], w0[k]) for k in w0)


@pytest.mark.slow
def test_two_process_fsdp2_matches_ddp(ddp_run, tmp_path):
    # FSDP2 shards every decoder layer over the 2 ranks; with the same data and loss normalisation the
    # final weights must match DDP's up to float reduction order.
    out = tmp_path / "run"
    res = train(out, "trainer=fsdp", *COMMON)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["world_size"] == 2
    assert all(json.loads((out / "audit" / f"rank{r}.json").read_text())["sharded"] for r in (0, 1))
    ddp = _weights(ddp_run, 0)
    full0, full1 = _weights(out, 0), _weights(out, 1)  # iter_full_parameters gathers the shards on each rank
    assert full0.keys() == ddp.keys()
    assert all(torch.equal(full0[k], full1[k]) for k in full0)
    for k in ddp:
        torch.testing.assert_close(full0[k], ddp[k], rtol=1e-4, atol=1e-5)
    exported = AutoModelForCausalLM.from_pretrained(out / "policy").state_dict()
    assert all(torch.equal(exported[k], full0[k]) for k in full0)
    assert (out / "checkpoints" / "last.ckpt").is_file()


ASYNC = ["rollout=hf_copy", "rollout.async_generation=true"]


@pytest.mark.slow
@pytest.mark.parametrize("rollout", [[], ASYNC, [*ASYNC, "rollout.refresh=adaptive", "rollout.max_drift=1e-4"]],
                         ids=["hf", "async", "async_adaptive"])
def test_two_process_resume_inside_an_offpolicy_buffer_is_exact(tmp_path, rollout):
    # k = 2, checkpoint after step 1: each rank is half-way through ITS OWN buffer (disjoint prompts). The
    # checkpoint must hold every rank's buffer, so the resumed run trains each rank on the same rows as the
    # uninterrupted one and ends with the same weights (rank 0's buffer on both ranks would duplicate groups).
    steps = 4
    common = ["trainer=ddp", *[o for o in COMMON if not o.startswith("trainer.max_steps")], f"trainer.max_steps={steps}",
              "algo=grpo_offpolicy", "algo.steps_per_generation=2", "trainer.val_check_interval=100",
              "val.at_start=false", "callbacks.model_checkpoint.every_n_train_steps=1",
              "callbacks.model_checkpoint.monitor=null", "callbacks.model_checkpoint.save_top_k=-1",
              "callbacks.model_checkpoint.filename='step{step}'", "save_policy=false", *rollout]
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    res = train(full, *common)
    assert res.returncode == 0, res.stderr[-3000:]
    res = train(resumed, *common, f"ckpt_path={full / 'checkpoints' / 'step1.ckpt'}")
    assert res.returncode == 0, res.stderr[-3000:]
    for r in (0, 1):
        a = [json.loads(x) for x in (full / "audit" / f"rank{r}.jsonl").read_text().splitlines()]
        b = [json.loads(x) for x in (resumed / "audit" / f"rank{r}.jsonl").read_text().splitlines()]
        assert [row["uids"] for row in b] == [row["uids"] for row in a[1:]], f"rank {r} trained on other rows"
        wa, wb = _weights(full, r), _weights(resumed, r)
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
    if "rollout.refresh=adaptive" in rollout:  # the ranks' averaged drift ended a buffer early, alike on resume
        sa, sb = (json.loads((d / "summary.json").read_text()) for d in (full, resumed))
        assert sa["drift_refreshes"] >= 1 and sb["drift_refresh_steps"] == sa["drift_refresh_steps"]
    if not rollout:  # one process cannot take over two ranks' buffers: refused, naming the way out
        single = [o for o in common if o not in ("trainer=ddp", "trainer.devices=2")]
        res = train(tmp_path / "single", *single, f"ckpt_path={full / 'checkpoints' / 'step1.ckpt'}")
        assert res.returncode != 0
        assert "rank buffers in the checkpoint: 2, processes now: 1" in res.stderr and "resume_drop_buffer" in res.stderr
