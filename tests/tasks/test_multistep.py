"""The claim study's second embedded task: multi-step arithmetic (running sums), its verification and its configs."""

import doctest

import pytest
from conftest import compose_train_cfg
from hydra.utils import instantiate

import grpolab.tasks.multistep as multistep_mod
from grpolab.models import build_char_tokenizer
from grpolab.tasks.multistep import MultiStepArithmeticTask, running_sums
from grpolab.verifiers.exact import ExactMatchVerifier


def test_doctests():
    assert doctest.testmod(multistep_mod).failed == 0


def _check(prompt: str) -> str:
    """Recompute the gold from the prompt text alone (independent of running_sums)."""
    expr, out = prompt.rstrip("="), []
    for i, ch in enumerate(expr):
        if ch in "+-" and i > 0:
            nxt = next((j for j in range(i + 1, len(expr)) if expr[j] in "+-"), len(expr))
            out.append(str(eval(expr[:nxt])))  # noqa: S307 - digits and +/- only
    return ",".join(out)


def test_rows_are_correct_disjoint_and_fixed_by_generator_seed():
    task = MultiStepArithmeticTask(num_terms=4, operations="+-", num_problems=600, val_size=50, test_size=100, seed=3)
    s = task.splits()
    assert (len(s["train"]), len(s["val"]), len(s["test"])) == (450, 50, 100)
    uids = [r["uid"] for split in s.values() for r in split]
    assert len(set(uids)) == 600
    for r in s["train"][:200] + s["test"]:
        assert r["answer"] == _check(r["prompt"]) and r["prompt"].count("+") + r["prompt"].count("-") == 3
    assert any("-" in r["answer"] for r in s["train"])  # subtraction can go negative
    other = MultiStepArithmeticTask(num_terms=4, operations="+-", num_problems=600, val_size=50, test_size=100, seed=4)
    assert {r["uid"] for r in task.load_rows()} == {r["uid"] for r in other.load_rows()}  # seed only splits
    assert s["test"] != other.splits()["test"]


def test_running_sums_hand_computed():
    assert running_sums([12, 34, 56, 7], ["+", "+", "+"]) == [46, 102, 109]
    assert running_sums([5, 9], ["-"]) == [-4]


def test_every_character_is_in_the_tiny_vocabulary():
    tok = build_char_tokenizer()
    task = MultiStepArithmeticTask(num_terms=5, operations="+-", num_problems=300, val_size=10, test_size=10)
    for r in task.load_rows()[:100]:
        ids = tok(r["prompt"] + r["answer"], add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids and tok.decode(ids) == r["prompt"] + r["answer"]


def test_exact_verifier_needs_every_step():
    v = ExactMatchVerifier()
    assert v(["46,102,109", "46,102,108", "109", " 46,102,109\n"], answer=["46,102,109"] * 4) == [1.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize("kwargs,key", [({"num_terms": 1}, "data.num_terms"), ({"operations": "*"}, "data.operations"),
                                        ({"min_value": 5, "max_value": 2}, "data.min_value"),
                                        ({"num_problems": 10}, "data.num_problems"),
                                        ({"num_terms": 2, "max_value": 3, "num_problems": 400}, "data.num_problems")])
def test_bad_settings_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        MultiStepArithmeticTask(**kwargs)


@pytest.mark.parametrize("config_name", ["train", "eval"])
def test_data_multistep_composes_with_its_completion_budget(tmp_path, config_name):
    cfg = compose_train_cfg(tmp_path, ["data=multistep"], config_name=config_name)
    task = instantiate(cfg.data)
    assert isinstance(task, MultiStepArithmeticTask) and len(task.splits()["test"]) == 256
    longest = max(len(r["answer"]) for r in task.load_rows())
    assert cfg.algo.max_completion_length >= longest + 1  # the whole chain and the stop token fit
    assert cfg.model.warmstart.target_accuracy == 0.25  # the tiny model warm-starts on it (its own cache entry)
    cfg2 = compose_train_cfg(tmp_path, ["data=multistep", "algo.max_completion_length=20"], config_name=config_name)
    assert cfg2.algo.max_completion_length == 20  # the command line still wins
