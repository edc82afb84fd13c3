"""Verifier: weights, unscorable rows, the truncation policy, Hydra configs, gold checks."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from grpolab.verifiers.format import FormatVerifier
from grpolab.verifiers.gsm8k import GSM8KVerifier
from grpolab.verifiers.math import MathVerifier
from grpolab.verifiers.reward import RewardOutput, Verifier

CONF = Path(__file__).resolve().parents[2] / "conf" / "verifier"


def fixed(values):
    """A reward function returning fixed values (ignores its input)."""

    def func(completions, **kwargs):
        return list(values)

    return func


def test_weighted_sum_and_none_propagation():
    rm = Verifier(
        {"a": fixed([1.0, None, 0.0]), "b": fixed([1.0, 1.0, None])}, {"a": 1.0, "b": 0.5}, timeout_s=None
    )
    out = rm(["x", "y", "z"], answer=["1", "1", "1"])
    assert isinstance(out, RewardOutput)
    assert out.rewards == [1.5, None, None]  # unscorable is never correct, nor partly correct
    assert out.per_func == {"a": [1.0, None, 0.0], "b": [1.0, 1.0, None]}
    assert out.num_unscorable == 2 and out.num_timeouts == 0
    metrics = out.metrics()
    assert metrics["rewards/a/mean"] == 0.5 and metrics["rewards/b/mean"] == 1.0
    assert metrics["rewards/num_unscorable"] == 2.0


def test_zero_weight_function_is_logged_but_cannot_make_a_row_unscorable():
    rm = Verifier({"a": fixed([1.0, 0.0]), "b": fixed([None, None])}, {"a": 1.0, "b": 0.0}, timeout_s=None)
    out = rm(["x", "y"], answer=["1", "1"])
    assert out.rewards == [1.0, 0.0]
    assert math.isnan(out.metrics()["rewards/b/mean"])


def test_default_weights_are_one():
    rm = Verifier({"a": fixed([1.0]), "b": fixed([0.5])}, timeout_s=None)
    assert rm(["x"], answer=["1"]).rewards == [1.5]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"reward_funcs": {}}, "empty"),
        ({"reward_funcs": {"a": 3}}, "not callable"),
        (
            {"reward_funcs": {"math": MathVerifier()}, "reward_weights": {"maths": 1.0}},
            r"unknown: \['maths'\]",
        ),
        (
            {"reward_funcs": {"a": fixed([1]), "b": fixed([1])}, "reward_weights": {"a": 1.0}},
            r"missing: \['b'\]",
        ),
        ({"reward_funcs": {"a": fixed([1])}, "num_workers": -1}, "num_workers"),
        ({"reward_funcs": {"a": fixed([1])}, "timeout_s": 0}, "timeout_s"),
        ({"reward_funcs": {"a": fixed([1])}, "on_truncated": "ignore"}, "on_truncated"),
    ],
)
def test_configuration_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Verifier(**kwargs)


def test_columns_must_be_aligned_with_completions():
    rm = Verifier({"gsm8k": GSM8KVerifier()}, timeout_s=None)
    with pytest.raises(ValueError, match="'answer' has 1 values for 2 completions"):
        rm(["#### 1", "#### 2"], answer=["1"])
    with pytest.raises(ValueError, match="returned 1 values for 2"):
        Verifier({"bad": fixed([1.0])}, timeout_s=None)(["a", "b"], answer=["1", "2"])


@pytest.mark.parametrize(
    "policy, expected", [("score", [1.0, 1.0]), ("zero", [1.0, 0.0]), ("unscorable", [1.0, None])]
)
def test_truncation_policy(policy, expected):
    rm = Verifier({"gsm8k": GSM8KVerifier()}, timeout_s=None, on_truncated=policy)
    # The truncated completion wrote its marker (without one it would score 0: no last-number fallback).
    out = rm(["#### 18", "9 * 2 = 18\n#### 18\nSo she"], answer=["18", "18"], truncated=[False, True])
    assert out.rewards == expected
    assert out.per_func["gsm8k"] == [1.0, 1.0]  # the verifier's own verdict is kept for logging


def test_every_execution_mode_gives_the_same_rewards(shared_data):
    rows = [json.loads(x) for x in (shared_data / "math500" / "test.jsonl").read_text().splitlines()[:6]]
    completions, golds = [], []
    for r in rows:
        completions += [
            f"<think>hmm</think><answer>$\\boxed{{{r['answer']}}}$</answer>",
            r["solution"],
            "no idea",
        ]
        golds += [r["answer"]] * 3
    funcs = {"math": MathVerifier(), "format": FormatVerifier()}
    weights = {"math": 1.0, "format": 0.1}
    results = []
    for timeout_s, num_workers in [(None, 0), (30.0, 0), (30.0, 1)]:
        rm = Verifier(funcs, weights, timeout_s=timeout_s, num_workers=num_workers)
        try:
            results.append(rm(completions, answer=golds, uid=[str(i) for i in range(len(golds))]))
        finally:
            rm.close()
    assert results[0].rewards == [1.1, 1.0, 0.0] * len(rows)
    for other in results[1:]:
        assert other.rewards == results[0].rewards and other.per_func == results[0].per_func


def test_hydra_configs_instantiate_and_score():
    for path in sorted(CONF.glob("*.yaml")):
        rm = instantiate(OmegaConf.load(path))
        assert isinstance(rm, Verifier), path.name
        for name, func in rm.reward_funcs.items():
            assert callable(func) and getattr(func, "name", None) == name, (path.name, name)
    rm = instantiate(OmegaConf.load(CONF / "math_format.yaml"))
    assert rm.reward_weights == {"math": 1.0, "format": 0.1}
    out = rm(["<think>2+2</think><answer>$\\boxed{4}$</answer>", "$\\boxed{4}$"], answer=["4", "4"])
    assert out.rewards == [1.1, 1.0]
    assert set(out.metrics()) >= {"rewards/math/mean", "rewards/format/mean"}
    rm = instantiate(OmegaConf.load(CONF / "gsm8k.yaml"))
    assert rm(["#### 1,000"], answer=["1000"]).rewards == [1.0]


def test_verifiers_work_standalone_with_trl_keywords():
    assert GSM8KVerifier()(completions=["#### 7"], answer=["7"], prompts=["p"]) == [1.0]
    assert MathVerifier()(completions=["$\\boxed{7}$"], answer=["7"]) == [1.0]


def test_copies_do_not_share_worker_processes():
    rm = Verifier({"gsm8k": GSM8KVerifier()}, timeout_s=5.0, num_workers=1)
    try:
        assert rm(["#### 1"], answer=["1"]).rewards == [1.0]
        clone = copy.deepcopy(rm)
        assert clone._pool is not rm._pool
        assert clone(["#### 2"], answer=["1"]).rewards == [0.0]
        clone.close()
    finally:
        rm.close()


def test_filter_rows_skips_and_counts_unparseable_golds():
    rows = [{"uid": "a", "answer": "1"}, {"uid": "b", "answer": "n/a"}, {"uid": "c", "answer": "-3"}]
    rm = Verifier({"gsm8k": GSM8KVerifier(), "format": FormatVerifier()}, timeout_s=None)
    assert rm.unscorable_golds([r["answer"] for r in rows]) == [1]
    kept, skipped = rm.filter_rows(rows, "gsm8k train")
    assert [r["uid"] for r in kept] == ["a", "c"] and skipped == 1
    with pytest.raises(ValueError, match="no gold answer can be parsed"):
        rm.filter_rows([{"uid": "b", "answer": "n/a"}], "gsm8k train")
    with pytest.raises(ValueError, match="row 1 has no 'answer' column"):
        rm.filter_rows([{"uid": "a", "answer": "1"}, {"uid": "b", "gold": "2"}], "gsm8k train")
    math_rm = Verifier({"math": MathVerifier()}, timeout_s=None)
    assert math_rm.unscorable_golds([r"\frac{1}{2}", r"\frac{1}{", "-2,1"]) == [1]
