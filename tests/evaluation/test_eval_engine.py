"""src/eval.py builds its engine as training does (resolve_rollout: the engine's own checks before any model, the async
variant) and closes it when the evaluation ends, also when sampling fails."""

from __future__ import annotations

import json

import pytest
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.errors import ConfigError
from grpolab.evaluation.evaluate import evaluate
from grpolab.rollout.engines.hf import HFGenerationEngine
from grpolab.rollout.engines.hf_copy import HFSamplerCopyEngine

MODEL_DATA = [o for o in FAST_OVERRIDES if o.startswith(("model.", "data."))]  # a random tiny model, offline
SMALL = ["eval.num_samples=2", "eval.max_prompts=4", "eval.progress_bar=false"]


class ClosingEngine(HFGenerationEngine):
    """The in-place engine, counting its ``close`` calls; ``fail=true`` makes its generate raise."""

    closed = 0

    def __init__(self, *args, fail: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fail = fail

    def generate(self, model, prompts, params):
        if self.fail:
            raise RuntimeError("the sampler died")
        return super().generate(model, prompts, params)

    def close(self) -> None:
        type(self).closed += 1

    async_target = f"{__name__}.CopyVariant"


class CopyVariant(HFSamplerCopyEngine):
    """``ClosingEngine``'s variant with ``rollout.async_generation=true``: a copy of the policy, counting builds."""

    built = 0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        type(self).built += 1


def _eval(out, overrides):
    return evaluate(compose_train_cfg(out, [*MODEL_DATA, *SMALL, *overrides], config_name="eval"))


def test_the_engine_is_closed_after_the_evaluation_and_after_a_failure(tmp_path):
    ClosingEngine.closed = 0
    target = f"rollout._target_={__name__}.ClosingEngine"
    result = _eval(tmp_path / "ok", [target])
    assert ClosingEngine.closed == 1 and result["num_prompts"] == 4
    with pytest.raises(RuntimeError, match="the sampler died"):
        _eval(tmp_path / "failed", [target, "+rollout.fail=true"])
    assert ClosingEngine.closed == 2 and not (tmp_path / "failed" / "eval.json").exists()


def test_the_engine_is_checked_before_any_model_is_built(tmp_path):
    with pytest.raises(ConfigError, match="rollout.cache_implementation must be one of"):
        _eval(tmp_path, ["rollout.cache_implementation=static"])
    with pytest.raises(ConfigError, match="rollout._target_='nowhere.Engine' is not an importable class"):
        _eval(tmp_path, ["rollout._target_=nowhere.Engine"])
    with pytest.raises(ConfigError, match=r"rollout\._target_='grpolab\.rollout\.rules\.steps\.EveryKSteps' is not a "
                                          r"grpolab\.rollout\.engines\.base\.GenerationEngine subclass"):
        _eval(tmp_path, ["rollout._target_=grpolab.rollout.rules.steps.EveryKSteps"])  # a class, but no engine
    assert not (tmp_path / "cache").exists()  # nothing was loaded


def test_the_async_variant_samples_what_the_live_policy_samples(tmp_path):
    # rollout.async_generation=true resolves to the engine's copy-owning variant, as in training; the copy holds the
    # policy's weights (pushed once), so the same seed gives the same completions as sampling in place
    CopyVariant.built = 0
    in_place = _eval(tmp_path / "hf", [f"rollout._target_={__name__}.ClosingEngine"])
    copy = _eval(tmp_path / "copy", [f"rollout._target_={__name__}.ClosingEngine", "rollout.async_generation=true"])
    assert CopyVariant.built == 1
    rows = [(tmp_path / d / "completions.jsonl").read_text().splitlines() for d in ("hf", "copy")]
    assert [json.loads(r)["completion"] for r in rows[0]] == [json.loads(r)["completion"] for r in rows[1]]
    assert copy["accuracy"] == in_place["accuracy"]
