"""Every config file composes, and every algo/model/data/verifier option builds its object."""

from pathlib import Path

import pytest
from conftest import REPO_ROOT, SHARED_DATA, compose_train_cfg
from hydra.utils import instantiate
from omegaconf import OmegaConf

from grpolab.config import GRPOConfig
from grpolab.rollout.settings import resolve_rollout

CONF = REPO_ROOT / "conf"


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml") if p.stem != "base")


@pytest.mark.parametrize("group", ["algo", "model", "data", "verifier", "rollout", "rollout/refresh", "trainer", "logger",
                                   "callbacks"])
def test_every_option_of_every_group_composes(tmp_path, group):
    for option in _options(group):
        extra = ["model.tokenizer_path=x"] if (group, option) == ("model", "tiny_qwen") else []
        cfg = compose_train_cfg(tmp_path, [f"{group}={option}", *extra])
        cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves


@pytest.mark.parametrize("algo", _options("algo"))
def test_algo_configs_validate(tmp_path, algo):
    cfg = compose_train_cfg(tmp_path, [f"algo={algo}"])
    algo_cfg = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))
    expected = {"grpo_onpolicy": (1, 1), "grpo_offpolicy": (10, 1), "grpo_reuse": (1, 10),
                "grpo_async": (1, 1), "grpo_onpolicy_prev_window": (1, 1)}.get(algo, (10, 1))
    assert (algo_cfg.steps_per_generation, algo_cfg.num_iterations) == expected
    assert algo_cfg.name == algo
    # algo=grpo_async alone turns asynchronous generation on (a rollout setting), with the PPO window
    assert cfg.rollout.async_generation is (algo == "grpo_async")
    if algo == "grpo_async":
        assert algo_cfg.clip_mode == "ppo"
        assert compose_train_cfg(tmp_path, ["algo=grpo_async", "rollout=vllm"]).rollout.async_generation is True
    if algo == "grpo_onpolicy_prev_window":  # on-policy with the window on pi/pi_{t-1}, synchronous
        assert algo_cfg.ratio_reference == "previous" and algo_cfg.clip_mode == "ppo"
    if algo.startswith("grpo_offpolicy"):  # the paper's setting and the claim study's candidates, one change each
        changed = {"grpo_offpolicy_ppo": algo_cfg.clip_mode == "ppo", "grpo_offpolicy_cap": algo_cfg.importance_weight_cap == 2.0,
                   "grpo_offpolicy_anchor": algo_cfg.ratio_reference == "anchor", "grpo_offpolicy": True}[algo]
        assert changed and algo_cfg.mask_zero_std_groups
        assert algo_cfg.clip_mode == ("ppo" if algo == "grpo_offpolicy_ppo" else "offpolicy_grpo")


@pytest.mark.parametrize("rule", _options("rollout/refresh"))
def test_every_refresh_rule_builds_under_its_own_name(tmp_path, rule):
    """conf/rollout/refresh/<name>.yaml puts its node at rollout.refresh.<name> (its package line) and builds the rule
    called <name>, with the paper's off-policy schedule."""
    assert (CONF / "rollout" / "refresh" / f"{rule}.yaml").read_text().startswith(f"# @package rollout.refresh.{rule}\n")
    cfg = compose_train_cfg(tmp_path, ["algo=grpo_offpolicy", f"rollout/refresh={rule}"])
    algo = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))
    _, _, settings = resolve_rollout(OmegaConf.to_container(cfg.rollout, resolve=True), algo)
    assert [r.name for r in settings.refresh_rules(algo)] == [rule]


@pytest.mark.parametrize(
    "data,path,verifier",
    [("gsm8k", "gsm8k/train.jsonl", "gsm8k"), ("math500", "math500/test.jsonl", "math"),
     ("arithmetic", None, "exact")],
)
def test_data_and_verifier_configs_build_on_local_data(tmp_path, data, path, verifier):
    overrides = [f"data={data}", f"verifier={verifier}"]
    if path:
        if not (SHARED_DATA / path).exists():
            pytest.skip("shared data missing")
        overrides.append(f"data.path={SHARED_DATA / path}")
    cfg = compose_train_cfg(tmp_path, overrides)
    task = instantiate(cfg.data)
    reward = instantiate(cfg.verifier)
    row = task.splits()["val"][0]
    out = reward([f"\\boxed{{{row['answer']}}} #### {row['answer']}" if path else row["answer"]],
                 answer=[row["answer"]], truncated=[False])
    assert out.rewards == [1.0]


def test_model_specs_are_lightweight(tmp_path):
    # Instantiating a model config loads nothing (weights load in GRPOModule.configure_model).
    for option in ("qwen1.5b", "qwen7b", "r1_distill_qwen1.5b"):
        cfg = compose_train_cfg(tmp_path, [f"model={option}"])
        spec = instantiate(cfg.model)
        assert spec.source == cfg.model.name_or_path and spec.dtype == "bfloat16"
    (tmp_path / "local").mkdir()  # a missing model.path folder is an error at instantiation
    cfg = compose_train_cfg(tmp_path, ["model=qwen0.5b", f"model.path={tmp_path / 'local'}"])
    assert instantiate(cfg.model).source == str(Path(tmp_path / "local"))
