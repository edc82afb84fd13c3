"""The rollout contract: an engine defined outside grpolab trains through the config alone, the buffer's k x i
schedule (pending steps, lag), and a timed-out background sampler is joined."""

from __future__ import annotations

import json
import re
import threading
import time

import pandas as pd
import pytest
import torch
from conftest import FAST_OVERRIDES, REPO_ROOT, compose_train_cfg

from grpolab.app.run import build, run_training
from grpolab.rollout.buffer import Minibatch, RolloutBuffer
from grpolab.rollout.engines.base import Generation, GenerationEngine, SamplingParams, left_pad
from grpolab.rollout.engines.hf_copy import HFSamplerCopyEngine
from grpolab.rollout.schedule import Schedule


class NaiveDecodeEngine(GenerationEngine):
    """A real engine written against the interface alone: decoding without a KV cache (the whole sequence is run
    again for every new token), on the live policy. Log alpha is recomputed by the trainer (the default)."""

    generate_calls = 0

    def __init__(self, stop_token_ids: list[int], pad_token_id: int) -> None:
        self.stop_token_ids, self.pad_token_id = list(stop_token_ids), pad_token_id

    @torch.no_grad()
    def generate(self, model, prompts: list[list[int]], params: SamplingParams) -> Generation:
        type(self).generate_calls += 1
        was_training = model.training
        model.eval()
        ids, mask = left_pad(prompts, self.pad_token_id)
        prompt_ids, prompt_mask = ids.clone(), mask.clone()
        stop = torch.tensor(self.stop_token_ids)
        done = torch.zeros(len(prompts), dtype=torch.bool)
        out = []
        for _ in range(params.max_new_tokens):
            positions = (mask.cumsum(1) - 1).clamp(min=0)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1].float()
            if params.do_sample:
                probs = torch.softmax(logits / params.temperature, -1)
                token = torch.multinomial(probs, 1, generator=params.generator)[:, 0]
            else:
                token = logits.argmax(-1)
            token = torch.where(done, torch.full_like(token, self.pad_token_id), token)
            out.append(token)
            new_mask = (~done).long()
            done = done | torch.isin(token, stop)
            ids, mask = torch.cat([ids, token[:, None]], 1), torch.cat([mask, new_mask[:, None]], 1)
            if done.all():
                break
        model.train(was_training)
        completion = torch.stack(out, 1)
        is_stop = torch.isin(completion, stop)
        before_stop = (is_stop.long().cumsum(1) - is_stop.long()) == 0  # up to and including the first stop
        return Generation(prompt_ids, prompt_mask, completion, before_stop, ~is_stop.any(1))


def test_an_engine_outside_src_trains_through_one_yaml(tmp_path):
    conf = tmp_path / "conf" / "rollout"
    conf.mkdir(parents=True)
    (conf / "naive.yaml").write_text(f"defaults:\n  - base\n  - _self_\n_target_: {__name__}.NaiveDecodeEngine\n")
    NaiveDecodeEngine.generate_calls = 0
    cfg = compose_train_cfg(tmp_path / "run", [*FAST_OVERRIDES, f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
                                               "rollout=naive", "algo=grpo_offpolicy", "algo.steps_per_generation=2",
                                               "trainer.max_steps=4", "val.at_start=false"])
    summary = run_training(cfg)
    assert summary["steps"] == 4 and summary["sampler_refreshes"] == 2 and summary["weight_syncs"] == 2
    assert NaiveDecodeEngine.generate_calls >= 2 + 2  # two refreshes, and validation (sampled + greedy)
    train = pd.read_csv(tmp_path / "run" / "metrics.csv").dropna(subset=["train/loss"])
    assert train["train/lag"].tolist() == [0, 1, 0, 1]
    assert train["train/ratio/max"].iloc[0] == 1.0 and train["train/tv_token"].iloc[0] == 0.0  # lag 0: exact


def test_pending_steps_are_counted_in_steps_not_minibatches(tmp_path):
    # k = 1, i = 2: after one step the buffer's single minibatch still has an iteration to serve. A checkpoint
    # there holds pending rows, so resuming it on another process count must be refused (each rank held its own
    # buffer); comparing the step position with the minibatch count took the buffer for used up.
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "algo=grpo_reuse", "algo.num_iterations=2",
                                       "trainer.max_steps=1", "val.at_start=false", "save_policy=false"])
    parts = build(cfg)
    dm = parts["datamodule"]
    parts["trainer"].fit(parts["module"], datamodule=dm)
    state = dm.state_dict()
    assert state["position"] == 1 and len(state["buffer"]) == 1
    assert dm.buffer.has_pending() and RolloutBuffer.saved_has_pending(state, num_iterations=2)
    from grpolab.rollout.resume import resumable_state

    with pytest.raises(ValueError, match="rank buffers in the checkpoint: 1, processes now: 2"):
        resumable_state(state, dm.cfg, rank=0, world=2, drop_buffer=False)


def _mb(version: int) -> Minibatch:
    z = torch.zeros(2, 1)
    return Minibatch(z.long(), z.long(), z.long(), z.bool(), torch.zeros(2, dtype=torch.bool),
                     torch.zeros(2, dtype=torch.long), torch.zeros(2), torch.zeros(2), torch.zeros(2, dtype=torch.bool),
                     z, policy_version=version)


def test_the_buffer_serves_k_minibatches_i_times_with_their_lag():
    buffer = RolloutBuffer(Schedule(steps_per_generation=2, num_iterations=3, max_lag=5))
    assert buffer.needs_refresh() and not buffer.has_pending()
    buffer.fill([_mb(10), _mb(10)])
    ids = [id(mb) for mb in buffer.minibatches]
    seen = []
    for step in range(10, 16):
        mb = buffer.next(step)
        seen.append((ids.index(id(mb)), mb.iteration, mb.lag))
        assert len(buffer.remaining()) == (2 if step < 12 else 1 if step < 15 else 0)
    assert seen == [(0, 0, 0), (0, 1, 1), (0, 2, 2), (1, 0, 3), (1, 1, 4), (1, 2, 5)]
    assert buffer.needs_refresh() and buffer.rounds == 1
    with pytest.raises(RuntimeError, match="fill"):
        buffer.next(16)
    buffer.fill([_mb(16), _mb(12)])  # the second minibatch was sampled 4 steps before the first
    for step in (16, 17, 18):
        buffer.next(step)
    with pytest.raises(RuntimeError, match="lag 7 > rollout.max_lag=5"):
        buffer.next(19)
    with pytest.raises(ValueError, match="steps_per_generation=2"):
        buffer.fill([_mb(0)])


def test_completions_log_and_metrics_share_one_lag(tmp_path):
    # async generation with k = 2, i = 2: the lag runs k*i .. 2k*i - 1 and is not the minibatch index
    run_training(compose_train_cfg(tmp_path, [
        *FAST_OVERRIDES, "rollout.async_generation=true", "algo=grpo_offpolicy", "algo.steps_per_generation=2",
        "algo.num_iterations=2", "trainer.max_steps=8", "val.at_start=false", "callbacks.completions.every_n_steps=1",
        "callbacks.completions.max_rows=1"]))
    train = pd.read_csv(tmp_path / "metrics.csv").dropna(subset=["train/loss"]).reset_index(drop=True)
    rows = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    logged = {r["step"]: r["lag"] for r in rows}  # step = optimizer steps taken, this one included
    assert [logged[s + 1] for s in range(8)] == train["train/lag"].astype(int).tolist()
    assert max(logged.values()) >= 4  # beyond any minibatch index (0 or 1)


class StallingCopyEngine(HFSamplerCopyEngine):
    """The real copy engine whose buffers after the first take 1.5 s longer than the run waits for them."""

    calls = 0

    def generate(self, model, prompts, params):
        type(self).calls += 1
        if type(self).calls > 1:
            time.sleep(1.5)
        return super().generate(model, prompts, params)


def _sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("grpolab-rollout") and t.is_alive()]


def test_a_timed_out_sampler_thread_is_joined_before_the_run_ends(tmp_path):
    StallingCopyEngine.calls = 0
    assert not _sampler_threads()
    summary = run_training(compose_train_cfg(tmp_path, [
        *FAST_OVERRIDES, "rollout=hf_copy", "rollout.async_generation=true", f"rollout._target_={__name__}."
        "StallingCopyEngine", "rollout.generation_timeout_s=1", "trainer.max_steps=4", "val.at_start=false"]))
    assert summary["failed"] is True and "did not deliver rollout buffer 1 within" in summary["failure"]["reason"]
    assert not _sampler_threads()  # waited for once more (up to the timeout), and it finished


def test_the_rollout_code_keeps_its_shape():
    src = REPO_ROOT / "src" / "grpolab"
    files = list(src.rglob("*.py"))
    probing = [f for f in files if re.search(r"getattr\((self\.)?engine|hasattr\((self\.)?engine|\"\w*Engine\" in",
                                             f.read_text())]
    assert probing == []
    assert len((src / "rollout" / "datamodule.py").read_text().splitlines()) <= 180
    too_long = {str(f.relative_to(src)): n for f in files if (n := len(f.read_text().splitlines())) > 400}
    assert too_long == {}
    outside = [f"{f.relative_to(src)}:{i}" for f in files for i, line in enumerate(f.read_text().splitlines(), 1)
               if re.search(r"(?<!docs/)(?<!docs/guide/)(pitfalls|paper|design)\.md|[Ii]ssue \d+", line)]
    assert outside == []
