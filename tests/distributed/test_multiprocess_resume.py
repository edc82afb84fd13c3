"""2-process resume inside an off-policy buffer (gloo), launched as a user does: each rank resumes its own buffer."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import torch
from conftest import FAST_OVERRIDES, compose_train_cfg
from ddp_helpers import COMMON, _weights, train

from grpolab.app.preflight import preflight
from grpolab.errors import ConfigError

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="2 CPU processes need 2 cores")


ASYNC = ["rollout=hf_copy", "rollout.async_generation=true"]
# drift past 1e-4 or an ESS below 1 - 1e-5: any step's move of the policy passes either, round-off neither
RULES = ["rollout/refresh=[drift,ess]", "rollout.refresh.drift.max_drift=1e-4", "rollout.refresh.ess.min_ess=0.99999"]


@pytest.mark.slow
# async rules: a buffer in flight at the checkpoint, taken early on the ranks' pooled drift or ESS, which each rank reads
# from its own served minibatch (checkpointed per rank); plain async resume is covered in one process by
# tests/rollout/test_async.py, the 2-process part is the same per-rank buffer state
# reuse_anchor: resumed inside a minibatch's iterations: each rank's anchor log-probs (log pi_k at the minibatch's
# first use, read by decoupled_ppo) come back from the checkpoint, its own, not rank 0's
# (the plain k = 2 buffer of the hf engine, once a case of its own, is inside both: async_rules holds a k = 2 buffer
# per rank, reuse_anchor a k = 1 buffer reused over 3 iterations; a 2-process case costs two runs' start-ups)
@pytest.mark.parametrize("rollout", [[*ASYNC, *RULES],
                                     ["algo.steps_per_generation=1", "algo.num_iterations=3",
                                      "algo.clip_mode=decoupled_ppo"]],
                         ids=["async_rules", "reuse_anchor"])
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
    ma, mb = (pd.read_csv(d / "metrics.csv").dropna(subset=["train/loss"]).set_index("step") for d in (full, resumed))
    assert list(mb.index) == list(range(1, steps))
    # each rank's running token count comes back, its own (summed over ranks in the log; rank 0's on every rank
    # logged rank 0's count twice)
    assert mb["train/num_tokens"].tolist() == ma.loc[mb.index, "train/num_tokens"].tolist()
    if "algo.num_iterations=3" in rollout:  # k = 1: the sampler is pi_k (lag 0), so pi_k / alpha is 1 at every
        # step; each rank must read its own anchors (rank 0's on rank 1 gave 1.36)
        assert mb["train/ratio/anchor_mean"].tolist() == pytest.approx([1.0] * (steps - 1), abs=1e-6)
    for r in (0, 1):
        a = [json.loads(x) for x in (full / "audit" / f"rank{r}.jsonl").read_text().splitlines()]
        b = [json.loads(x) for x in (resumed / "audit" / f"rank{r}.jsonl").read_text().splitlines()]
        assert [row["uids"] for row in b] == [row["uids"] for row in a[1:]], f"rank {r} trained on other rows"
        wa, wb = _weights(full, r), _weights(resumed, r)
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
    if RULES[0] in rollout:  # the ranks' pooled drift and ESS ended buffers early, alike on resume
        sa, sb = (json.loads((d / "summary.json").read_text()) for d in (full, resumed))
        assert sa["drift_refreshes"] + sa["ess_refreshes"] >= 1
        assert (sb["drift_refresh_steps"], sb["ess_refresh_steps"]) == (sa["drift_refresh_steps"], sa["ess_refresh_steps"])
        # what the rules read at the first resumed step comes from each rank's own served minibatch in the checkpoint
        for column in ("train/rollout/drift", "train/rollout/ess"):
            assert mb[column].tolist() == ma.loc[mb.index, column].tolist(), column
    if "algo.num_iterations=3" in rollout:  # one process cannot take over two ranks' buffers: refused before any
        # model, naming the way out
        single = [o for o in common if o not in ("trainer=ddp", "trainer.devices=2") and "callbacks.audit" not in o]
        cfg = compose_train_cfg(tmp_path / "single", [*FAST_OVERRIDES, *single,
                                                      f"ckpt_path={full / 'checkpoints' / 'step1.ckpt'}"])
        with pytest.raises(ConfigError, match=r"rank buffers in the checkpoint: 2, processes now: 1.*resume_drop_buffer"):
            preflight(cfg)  # what src/train.py runs first (tests/test_cli_errors.py: one line, exit 2)
        assert not (tmp_path / "single" / "cache").exists()  # nothing was built
