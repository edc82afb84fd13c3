"""conf/experiment: the paper's three setups compose (for training and for evaluation), hold the paper's
known values, and their tasks and verifiers work on the local copies of the data in ../shared/data."""

from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT, compose_train_cfg
from hydra.utils import instantiate
from omegaconf import OmegaConf

from grpolab.config import GRPOConfig

EXPERIMENTS = sorted(p.stem for p in (REPO_ROOT / "conf" / "experiment").glob("*.yaml"))
# The paper's setups (GPU, pretrained models, the paper's knobs marked UNVERIFIED); `smoke` is a CPU check of
# the install and runs in test_quickstart.py (the README's step 2).
PAPER_EXPERIMENTS = [name for name in EXPERIMENTS if name.startswith("paper_")]
ALGOS = ["grpo_onpolicy", "grpo_offpolicy", "grpo_reuse"]


def compose_eval(overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="eval", overrides=overrides)


def test_the_three_paper_setups_exist():
    assert {"paper_gsm8k_qwen0.5b", "paper_deepscaler_r1distill1.5b", "paper_orz_qwen7b"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("experiment", PAPER_EXPERIMENTS)
def test_experiment_composes_for_training_with_every_algo(tmp_path, experiment, algo):
    cfg = compose_train_cfg(tmp_path, [f"experiment={experiment}", f"algo={algo}"])
    settings = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))  # validates every knob
    assert settings.name == algo
    # the regime comes from algo=, never from the experiment (the paper's v and i)
    expected = {"grpo_onpolicy": (1, 1), "grpo_offpolicy": (10, 1), "grpo_reuse": (1, 10)}[algo]
    assert (settings.steps_per_generation, settings.num_iterations) == expected
    assert cfg.trainer.accelerator == "gpu" and cfg.model._target_ == "grpolab.models.PretrainedModel"
    OmegaConf.to_container(cfg.model, resolve=True)
    OmegaConf.to_container(cfg.trainer, resolve=True)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_composes_for_evaluation(experiment):
    cfg = compose_eval([f"experiment={experiment}"])
    assert cfg.task_name == experiment  # eval.yaml lets an experiment set top-level keys
    assert cfg.eval.max_new_tokens == cfg.algo.max_completion_length
    OmegaConf.to_container(cfg.eval, resolve=True)


def test_every_unverified_value_is_documented():
    # Each experiment marks the values the paper does not confirm; at least these knobs carry the mark.
    for name in PAPER_EXPERIMENTS:
        text = (REPO_ROOT / "conf" / "experiment" / f"{name}.yaml").read_text()
        marked = {line.split(":")[0].strip() for line in text.splitlines() if "UNVERIFIED" in line and ":" in line}
        for knob in ("num_generations", "learning_rate", "beta", "epsilon", "advantage_epsilon", "temperature",
                     "max_completion_length", "loss_type", "max_steps"):
            assert knob in marked, f"{name}: {knob} is not marked UNVERIFIED"


def test_known_paper_values():
    gsm = compose_train_cfg(Path("/tmp"), ["experiment=paper_gsm8k_qwen0.5b"])
    assert gsm.model.name_or_path == "Qwen/Qwen2.5-0.5B-Instruct" and gsm.data._target_.endswith("GSM8KTask")
    assert gsm.algo.learning_rate == 5e-6 and gsm.eval.num_samples == 50  # pass@1 from 50 samples
    ds = compose_train_cfg(Path("/tmp"), ["experiment=paper_deepscaler_r1distill1.5b"])
    assert ds.model.name_or_path == "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"
    assert ds.data.hub_id == "agentica-org/DeepScaleR-Preview-Dataset"
    assert ds.algo.max_prompt_length + ds.algo.max_completion_length == 4096  # 4096-token context
    assert set(ds.eval_datasets) == {"math500", "aime24"} and ds.eval.num_samples == 32
    orz = compose_train_cfg(Path("/tmp"), ["experiment=paper_orz_qwen7b"])
    assert orz.model.name_or_path == "Qwen/Qwen2.5-7B" and orz.trainer.devices == 8
    assert OmegaConf.is_missing(orz.data, "path")  # the converted orz_math_57k file must be given


def _train_yaml_lets_experiments_set_top_level_keys() -> bool:
    defaults = [next(iter(d)) if isinstance(d, dict) else d
                for d in yaml.safe_load((REPO_ROOT / "conf" / "train.yaml").read_text())["defaults"]]
    return defaults.index("_self_") < defaults.index("experiment")


@pytest.mark.xfail(not _train_yaml_lets_experiments_set_top_level_keys(), strict=True,
                   reason="conf/train.yaml lists _self_ after experiment, so an experiment cannot set task_name/val")
def test_experiment_sets_top_level_training_keys(tmp_path):
    cfg = compose_train_cfg(tmp_path, ["experiment=paper_gsm8k_qwen0.5b"])
    assert cfg.task_name == "paper_gsm8k_qwen0.5b" and cfg.val.num_generations == 8


# ------------------------------------------------------------------------- tasks and verifiers on local data
def _check_task_and_verifier(data_cfg, verifier_cfg, split, completion_of, tokenizer, max_prompt_length, rows=20):
    task = instantiate(data_cfg)
    verifier = instantiate(verifier_cfg)
    splits = task.splits()
    chosen = splits["train"] + splits["val"] + splits["test"] if split == "all" else splits[split]
    sample = chosen[:rows]
    out = verifier([completion_of(r) for r in sample], answer=[r["answer"] for r in sample])
    assert out.rewards == [1.0] * len(sample)  # the gold, written as the model should, is correct
    wrong = verifier([completion_of({**r, "answer": "123456789"}) for r in sample],
                         answer=[r["answer"] for r in sample])
    assert all(v == 0.0 for v in wrong.rewards)
    for r in sample:  # the chat-formatted prompt fits the experiment's prompt budget
        assert len(tokenizer(task.format_prompt(r, tokenizer), add_special_tokens=False)["input_ids"]) <= max_prompt_length
    return splits, chosen


@pytest.fixture(scope="module")
def qwen_tokenizer():
    path = REPO_ROOT.parent / "shared" / "data" / "qwen2.5-tokenizer"
    if not path.is_dir():
        pytest.skip(f"{path} not found")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def test_gsm8k_experiment_on_local_gsm8k(tmp_path, shared_data, qwen_tokenizer):
    cfg = compose_train_cfg(tmp_path, ["experiment=paper_gsm8k_qwen0.5b", f"data.path={shared_data}/gsm8k/train.jsonl",
                                       f"data.test_path={shared_data}/gsm8k/test.jsonl"])
    splits, test = _check_task_and_verifier(cfg.data, cfg.verifier, "test", lambda r: f"Let me see.\n#### {r['answer']}",
                                            qwen_tokenizer, cfg.algo.max_prompt_length)
    assert len(test) == 1319 and len(splits["val"]) == cfg.data.val_size  # GSM8K test, as the paper evaluates
    assert "<|im_start|>user" in instantiate(cfg.data).format_prompt(test[0], qwen_tokenizer)


def test_deepscaler_experiment_eval_sets_on_local_math500(shared_data, qwen_tokenizer):
    cfg = compose_eval(["experiment=paper_deepscaler_r1distill1.5b", "eval.dataset=math500",
                        f"eval_datasets.math500.path={shared_data}/math500/test.jsonl"])
    _, rows = _check_task_and_verifier(cfg.eval_datasets.math500, cfg.verifier, "all",
                                       lambda r: f"So the answer is $\\boxed{{{r['answer']}}}$.", qwen_tokenizer,
                                       cfg.algo.max_prompt_length)
    assert len(rows) == 500  # every MATH-500 problem is scored (eval.dataset uses split "all")
    from grpolab.evaluation.evaluate import select_rows

    assert len(select_rows(instantiate(cfg.eval_datasets.math500), "all")) == 500
    # AIME24 and DeepScaleR are not in ../shared/data: their configs must at least name a source
    assert cfg.eval_datasets.aime24.hub_id == "HuggingFaceH4/aime_2024" and cfg.data.hub_id


def test_orz_experiment_verifier_and_task_on_a_local_file(tmp_path, qwen_tokenizer):
    # orz_math_57k is not in ../shared/data: check the documented {"prompt", "answer"} format on two rows
    rows = tmp_path / "orz.jsonl"
    rows.write_text('{"prompt": "What is $1+1$?", "answer": "2"}\n{"prompt": "Simplify $\\\\frac{2}{4}$.", '
                    '"answer": "\\\\frac{1}{2}"}\n' * 3)
    cfg = compose_train_cfg(tmp_path, ["experiment=paper_orz_qwen7b", f"data.path={rows}", "data.val_size=1"])
    _check_task_and_verifier(cfg.data, cfg.verifier, "train", lambda r: f"\\boxed{{{r['answer']}}}", qwen_tokenizer,
                             cfg.algo.max_prompt_length)
