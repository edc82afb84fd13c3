"""End-to-end: the sampler that owns its weights, asynchronous generation, lag bounds, resume, engine faults."""

import re
import time

import pandas as pd
import pytest
import torch
from certain_reward import varied
from conftest import FAST_OVERRIDES, compose_train_cfg
from transformers import AutoModelForCausalLM

from grpolab.app.run import run_training
from grpolab.rollout.engines.hf_copy import HFSamplerCopyEngine

ASYNC = ["rollout=hf_copy", "rollout.async_generation=true"]
TIMING = ("step_time", "time/", "tokens_per_second")


def _run(path, *overrides):
    summary = run_training(compose_train_cfg(path, [*FAST_OVERRIDES, "val.at_start=false", *overrides]))
    metrics = pd.read_csv(path / "metrics.csv")
    train = metrics.dropna(subset=["train/loss"]).reset_index(drop=True)
    return summary, train


def _weights(path):
    return AutoModelForCausalLM.from_pretrained(path / "policy").state_dict()


def _same_weights(a, b):
    wa, wb = _weights(a), _weights(b)
    return all(torch.equal(wa[k], wb[k]) for k in wa)


def _no_timing(train):
    return train[[c for c in train.columns if not any(t in c for t in TIMING)]]


def test_k1_copy_engine_trains_exactly_like_the_in_place_engine(tmp_path):
    common = ["trainer.max_steps=3", *varied(), "algo.learning_rate=1e-3"]
    s_in, m_in = _run(tmp_path / "inplace", *common)
    s_copy, m_copy = _run(tmp_path / "copy", *common, "rollout=hf_copy")
    assert _same_weights(tmp_path / "inplace", tmp_path / "copy")
    pd.testing.assert_frame_equal(_no_timing(m_in), _no_timing(m_copy))
    assert s_in["weight_syncs"] == s_copy["weight_syncs"] == s_copy["sampler_refreshes"] == 3
    assert (m_copy["train/time/weight_sync"] > 0).all()  # one push per step, timed


def test_async_lag_is_k_to_2k_minus_1_and_runs_are_deterministic(tmp_path):
    # rollout.async_generation=true alone: the default in-place engine is replaced by its copy-owning variant
    common = ["rollout.async_generation=true", "algo=grpo_offpolicy", "algo.steps_per_generation=3",
              "trainer.max_steps=9", *varied(), "algo.learning_rate=1e-3"]
    summary, train = _run(tmp_path / "a", *common)
    # buffer 0 from pi_0 (lag 0..2), then buffer r+1 from the weights pushed at refresh r (lag 3..5)
    assert train["train/lag"].tolist() == [0, 1, 2, 3, 4, 5, 3, 4, 5]
    assert train["train/lag/max"].iloc[-1] == 5
    # buffers 0 and 1 share the step-0 push; the step-6 refresh launches nothing (the run ends at step 9)
    assert summary["sampler_refreshes"] == 3 and summary["weight_syncs"] == 2
    assert train["train/tv_token"].iloc[3:].min() >= 0  # stale sampler: pi != alpha on every step with loss tokens
    stale = train[(train["train/lag"] >= 4) & (train["train/num_loss_tokens"] > 0)]
    assert len(stale) and (stale["train/tv_token"] > 0).all()
    _, again = _run(tmp_path / "b", *common)
    assert _same_weights(tmp_path / "a", tmp_path / "b")
    pd.testing.assert_frame_equal(_no_timing(train), _no_timing(again))


def test_max_lag_makes_the_sampler_wait_and_bad_settings_fail_early(tmp_path):
    _, train = _run(tmp_path / "run", *ASYNC, "algo=grpo_offpolicy", "algo.steps_per_generation=3",
                    "rollout.max_lag=4", "trainer.max_steps=6")
    # push delayed by 2k-1-max_lag = 1 step into each buffer: lags 2..4
    assert train["train/lag"].tolist() == [0, 1, 2, 2, 3, 4]
    with pytest.raises(ValueError, match="rollout.max_lag"):
        _run(tmp_path / "bad", *ASYNC, "algo=grpo_offpolicy", "rollout.max_lag=5")
    assert not (tmp_path / "bad" / "checkpoints").exists()  # refused before any model was built


def test_async_resume_regenerates_the_buffer_in_flight_exactly(tmp_path):
    # k = 3, checkpoint at step 4: buffer 1 is being trained on and buffer 2 is in flight from the weights of
    # step 3. The resumed run must regenerate buffer 2 from the saved sampler weights and end identical.
    common = [*ASYNC, "algo=grpo_offpolicy", "algo.steps_per_generation=3", "trainer.max_steps=8",
              "trainer.val_check_interval=100", "callbacks.model_checkpoint.every_n_train_steps=4",
              "callbacks.model_checkpoint.monitor=null", "callbacks.model_checkpoint.save_top_k=-1",
              "callbacks.model_checkpoint.filename='step{step}'", *varied(),
              "algo.learning_rate=1e-3"]
    full_summary, full = _run(tmp_path / "full", *common)
    ckpt = tmp_path / "full" / "checkpoints" / "step4.ckpt"
    state = torch.load(ckpt, weights_only=False)["RolloutDataModule"]
    assert state["in_flight"]["round"] == 2 and state["in_flight"]["policy_version"] == 3
    summary, resumed = _run(tmp_path / "resumed", *common, f"ckpt_path={ckpt}")
    assert summary["steps"] == 8 and summary["sampler_refreshes"] == 3
    # the regenerated buffer is counted once
    assert (summary["completions"], summary["weight_syncs"]) == (full_summary["completions"], full_summary["weight_syncs"])
    assert _same_weights(tmp_path / "full", tmp_path / "resumed")
    cols = ["train/lag", "train/reward", "train/loss"]
    pd.testing.assert_frame_equal(full[cols].iloc[4:].reset_index(drop=True), resumed[cols])


class FaultyEngine(HFSamplerCopyEngine):
    """A sampler whose third buffer stalls for 5 s (or fails): an engine that hangs or dies mid-run."""

    mode = "hang"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0

    def generate(self, model, prompts, params):
        self.calls += 1
        if self.calls == 3:
            if self.mode == "die":
                raise RuntimeError("sampler process died")
            time.sleep(5)
        return super().generate(model, prompts, params)


class DyingEngine(FaultyEngine):
    mode = "die"


@pytest.mark.parametrize("engine,message", [("FaultyEngine", "did not deliver rollout buffer 2 within"),
                                            ("DyingEngine", "sampler process died")])
def test_a_hanging_or_dying_sampler_stops_the_run_naming_the_step(tmp_path, engine, message):
    # (the trainer waits for buffer 2 at step 3, half-way through buffer 1: rollout.overlap_steps): the sampler
    # failure path, as without async: a failed summary and last.ckpt at the last completed step, buffer 2 in flight
    summary, _ = _run(tmp_path, *ASYNC, f"rollout._target_={__name__}.{engine}", "rollout.generation_timeout_s=1",
                      "algo=grpo_offpolicy", "algo.steps_per_generation=2", "trainer.max_steps=8",
                      "callbacks.model_checkpoint.every_n_train_steps=2", "callbacks.model_checkpoint.monitor=null")
    assert summary["failed"] is True and summary["failure"]["step"] == summary["steps"] == 3
    assert re.search(f"^RolloutEngineError: step 3: .*{message}", summary["failure"]["reason"])
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 3 and last["RolloutDataModule"]["in_flight"]["round"] == 2


def test_async_on_policy_settings_still_store_log_alpha(tmp_path):
    # k = i = 1 with async generation trains at lag 1: the ratio must be taken against the stale sampler,
    # so log alpha has to be stored although the synchronous k = i = 1 run skips it (its ratio is exactly 1).
    _, train = _run(tmp_path / "a", "rollout.async_generation=true", "trainer.max_steps=4",
                    *varied(), "algo.learning_rate=1e-3")
    assert train["train/lag"].tolist() == [0, 1, 1, 1]
    # (the warm-up schedule's lr is 0 at step 0, so pi_1 = pi_0 and step 1's sampler is not yet stale)
    # (equal weights give equal log-probs to fp32 round-off: the sampler copy has requires_grad off, which can
    # pick other kernels in the shared-prompt forward; a stale sampler gives tv_token ~1e-3)
    assert train["train/tv_token"].iloc[:2].lt(1e-6).all() and (train["train/tv_token"].iloc[2:] > 1e-5).all()


class SlowCopyEngine(HFSamplerCopyEngine):
    """The real copy engine, 0.5 s slower per buffer (a sampler that finishes long after the trainer's steps)."""

    def generate(self, model, prompts, params):
        time.sleep(0.5)
        return super().generate(model, prompts, params)


class ThreadLog(__import__("lightning").Callback):
    """Records the trainer thread's torch thread count at the start of every training step."""

    def __init__(self):
        self.threads = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.threads.append(torch.get_num_threads())


@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="needs 2 cores to split")
@pytest.mark.parametrize("engine", ["HFSamplerCopyEngine", "SlowCopyEngine"])
def test_the_trainer_takes_every_core_on_a_fixed_schedule(tmp_path, engine):
    # k=4: the next buffer is generated beside steps 0-1 of each buffer (overlap_steps null = 2), trainer and
    # sampler on half the cores; at step 2 the trainer waits for it and takes every core. A slow sampler changes
    # nothing in the schedule (timing never decides a thread count, so the bits cannot depend on it).
    from grpolab.app.run import build
    from grpolab.rollout.background import half_cores

    before = torch.get_num_threads()
    torch.set_num_threads(2 * half_cores())
    try:
        cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "val.at_start=false", f"torch_threads={2 * half_cores()}",
                                           *ASYNC, "algo=grpo_offpolicy",
                                           "algo.steps_per_generation=4", "trainer.max_steps=8",
                                           f"rollout._target_={__name__}.{engine}"])
        parts = build(cfg)
        log = ThreadLog()
        parts["trainer"].callbacks.append(log)
        parts["trainer"].fit(parts["module"], datamodule=parts["datamodule"])
        half, full = half_cores(), 2 * half_cores()
        # buffer 1 is generated beside steps 0-1; no buffer is needed after the step-4 refresh (max_steps 8)
        assert log.threads == [half, half, full, full, full, full, full, full]
        assert torch.get_num_threads() == full  # restored at teardown
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "two"])
def test_overlap_steps_must_be_a_positive_integer(tmp_path, value):
    with pytest.raises(ValueError, match="rollout.overlap_steps must be null or an integer >= 1"):
        _run(tmp_path, *ASYNC, f"rollout.overlap_steps={value}", "trainer.max_steps=2")


def test_async_bf16_buffers_are_sampled_under_the_training_autocast(tmp_path):
    # autocast is per thread: the background sampler enters the trainer's precision context itself, so with the
    # trainer's own log alpha (recompute_sampler_logp=true) the lag-0 ratio of the first buffer is exactly 1.
    _, train = _run(tmp_path / "a", *ASYNC, "rollout.recompute_sampler_logp=true", "trainer.precision=bf16-mixed",
                    "algo=grpo_offpolicy", "algo.steps_per_generation=2", *varied(),
                    "trainer.max_steps=3")
    lag0 = train[train["train/lag"] == 0]
    assert len(lag0) == 1 and lag0["train/ratio/max"].iloc[0] == 1.0 and lag0["train/ratio/min"].iloc[0] == 1.0
