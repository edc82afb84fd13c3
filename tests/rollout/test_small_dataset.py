"""A dataset smaller than one step.

It used to merge repeated prompts into groups of 16 or 24: prompts were drawn across epoch boundaries
and grouped by uid, so a prompt drawn twice in a buffer became one group of 2G with a baseline over both
draws. Now a training split smaller than one step is refused at setup, and a prompt drawn twice (a small
dataset crossing an epoch) makes two groups of G.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.app.run import run_training
from grpolab.config import GRPOConfig
from grpolab.rollout.engines.hf import HFGenerationEngine
from grpolab.rollout.producer import RolloutProducer


def test_a_prompt_drawn_twice_makes_two_groups_of_g(tiny_spec, arithmetic_task, exact_reward):
    tok = tiny_spec.load_tokenizer()
    cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=16, steps_per_generation=2, max_completion_length=3)
    prod = RolloutProducer(cfg, arithmetic_task, tok, HFGenerationEngine(tiny_spec.stop_token_ids(tok), tok.pad_token_id),
                           exact_reward)
    a, b, c = arithmetic_task.splits()["train"][:3]
    rows = [a, b, a, c, b, c, a, a]  # 3 rows drawn for 2 steps x 4 prompts: repeats inside one step too
    torch.manual_seed(0)
    mbs = prod.produce(tiny_spec.load_policy(), None, rows, round_index=0, policy_version=0)
    for mb in mbs:
        sizes = Counter(mb.group_ids.tolist())
        assert set(sizes.values()) == {4}, sizes  # every group has exactly G = 4 completions
        assert len(sizes) == 4  # 4 groups per step, even where the same prompt appears twice
        for gid in sizes:
            assert len({u for u, g in zip(mb.info["uids"], mb.group_ids.tolist()) if g == gid}) == 1


def test_a_training_split_smaller_than_one_step_is_refused(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) for i in range(5)) + "\n")
    # 5 rows - 1 val - 1 test = 3 training prompts; one step needs 8 / 2 = 4.
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "data=jsonl", f"data.path={path}", "data.val_size=1",
                                       "data.test_size=1", "algo.num_generations=2", "trainer.max_steps=2"])
    with pytest.raises(ValueError, match=r"training split has 3 usable rows, fewer than the 4 distinct prompts "
                                         r"one step needs \(algo.per_device_train_batch_size=8 / algo.num_generations=2"):
        run_training(cfg)
