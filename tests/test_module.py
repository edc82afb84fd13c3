"""Through the real training loop: the Theorem 1 bound after the update, and the reference refresh inside a
rollout buffer (the module refreshes its reference; each minibatch names the reference version that scored it)."""

import math

import lightning as L
import pandas as pd
import pytest
import torch
from certain_reward import varied
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.app.run import build, run_training
from grpolab.forward.logprob_pass import batched_log_probs

QUIET = ["trainer.val_check_interval=100", "val.at_start=false", "save_policy=false",
         *varied(), "algo.lr_scheduler=null"]  # reward variance for a random model; no warmup


def _metrics(tmp_path, *overrides):
    run_training(compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *QUIET, *overrides]))
    return pd.read_csv(tmp_path / "metrics.csv").dropna(subset=["train/loss"]).reset_index(drop=True)


def test_lower_bound_is_taken_after_the_update_every_n_steps(tmp_path):
    # On-policy at lag 0, pi_k = alpha: at pi = pi_k the bound is mean(A) = 0 whatever the update. Taken at
    # pi_{k+1} it is 0 only when the step did not move the policy (lr 0) and moves with a real update.
    common = ["trainer.max_steps=3", "algo.lower_bound_every=2"]
    still = _metrics(tmp_path / "lr0", *common, "algo.optimizer.lr=0.0")
    moved = _metrics(tmp_path / "lr", *common, "algo.learning_rate=1e-3")
    for m in (still, moved):
        assert m["train/lower_bound"].notna().tolist() == [True, False, True]  # steps 0 and 2 only
    assert still["train/lower_bound"].dropna().abs().max() < 1e-6
    assert still["train/lower_bound/c_tv"].dropna().abs().max() == 0.0
    assert moved["train/lower_bound"].dropna().abs().min() > 1e-4
    assert moved["train/lower_bound/c_tv"].dropna().min() > 0
    # KL(pi_k || pi_{k+1}) between consecutive policies: 0 for a step that moved nothing, > 0 for a real one
    assert still["train/lower_bound/kl_step"].dropna().abs().max() == 0.0
    assert moved["train/lower_bound/kl_step"].notna().tolist() == [True, False, True]
    assert moved["train/lower_bound/kl_step"].dropna().min() > 0
    never = _metrics(tmp_path / "never", "trainer.max_steps=1", "algo.lower_bound_every=0")
    assert "train/lower_bound" not in never.columns


def test_reference_refresh_inside_a_buffer_recomputes_the_stored_ref_log_probs(tmp_path):
    # k = 4 (one buffer of 4 minibatches), reference reset after step 2: minibatches 2 and 3 must be scored
    # against the new reference, not the one the buffer was sampled with.
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *QUIET, "algo=grpo_offpolicy", "algo.steps_per_generation=4",
                                       "algo.beta=0.04", "algo.ref_refresh_every=2", "algo.learning_rate=1e-3",
                                       "trainer.max_steps=3"])
    parts = build(cfg)
    module, dm = parts["module"], parts["datamodule"]
    parts["trainer"].fit(module, datamodule=dm)
    assert module.global_step == 3 and dm.buffer.position == 3 and len(dm.buffer.minibatches) == 4
    ref = module.reference
    for j in (2, 3):  # still to come after the refresh: recomputed under the new reference
        now = batched_log_probs(ref, dm.buffer.minibatches[j].tensors(), cfg.algo.temperature, None, True)
        assert torch.equal(dm.buffer.minibatches[j].ref_logp, now)
    # minibatch 0 was used before the refresh: it keeps the old reference's log-probs, which differ
    mb = dm.buffer.minibatches[0]
    m = mb.completion_mask
    diff = (batched_log_probs(ref, mb.tensors(), cfg.algo.temperature, None) - mb.ref_logp)[m].abs().max()
    assert diff > 1e-5 and math.isfinite(float(diff))


class _ReferenceAtEachStep(L.Callback):
    """Records, right before each training step, the minibatch's reference version, the module's, and whether the
    minibatch's ref_logp are the module's reference's log-probs of its completions at that moment."""

    def __init__(self, temperature: float) -> None:
        self.temperature, self.seen = temperature, []

    def on_train_batch_start(self, trainer, module, mb, batch_idx):
        now = batched_log_probs(module.reference, mb.tensors(), self.temperature, None, True)
        self.seen.append((module.global_step, mb.reference_version, module.models.reference_version,
                          torch.equal(mb.ref_logp, now)))


def test_each_minibatch_is_scored_by_the_reference_the_module_holds_when_it_is_used(tmp_path):
    # k = 4, i = 1, refresh every 2 steps: the reference holds the policy of step 0 for steps 0-1, of step 2 for
    # steps 2-3 (minibatches 2, 3 of the first buffer re-scored), of step 4 for steps 4-5 (the second buffer,
    # sampled at step 4 after that refresh)
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *QUIET, "algo=grpo_offpolicy", "algo.steps_per_generation=4",
                                       "algo.beta=0.04", "algo.ref_refresh_every=2", "algo.learning_rate=1e-3",
                                       "trainer.max_steps=6"])
    parts = build(cfg)
    seen = _ReferenceAtEachStep(cfg.algo.temperature)
    parts["trainer"].callbacks.append(seen)
    parts["trainer"].fit(parts["module"], datamodule=parts["datamodule"])
    assert seen.seen == [(0, 0, 0, True), (1, 0, 0, True), (2, 2, 2, True), (3, 2, 2, True), (4, 4, 4, True),
                         (5, 4, 4, True)]
    assert parts["module"].models.reference_version == 4  # no refresh after the last step


@pytest.mark.parametrize("override,key", [
    ("algo.ratio_reference=alpha", "algo.ratio_reference"),
    ("algo.importance_sampling_level=seq_sum", "algo.importance_sampling_level"),
    ("algo.lower_bound_every=-1", "algo.lower_bound_every"),
    ("algo.zero_std_threshold=-0.1", "algo.zero_std_threshold"),
])
def test_new_knobs_are_validated_before_any_model_is_built(tmp_path, override, key):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, override])
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        run_training(cfg)
    assert not (tmp_path / "cache").exists()
