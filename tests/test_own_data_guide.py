"""docs/guide/own-data.md runs as written: its ```python block (the reward function) is saved as the file it names,
then its ```bash blocks run in order through a real shell (bash) in a folder linking the repository's files, the
training line with fewer steps and the fast tiny model, the eval line on a few prompts. The run must have used the
page's reward function (``train/rewards/mine/mean`` in metrics.csv) and the eval must have scored with it. Its
``python src/train.py`` and ``python src/eval.py`` fork (``forkrun_shell.py``; ``GRPOLAB_TEST_FORK=0``: real)."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess

import pytest
from conftest import FAST_OVERRIDES, REPO_ROOT
from forkrun_shell import shell_env

PAGE = REPO_ROOT / "docs" / "guide" / "own-data.md"
FAST = " ".join(o for o in FAST_OVERRIDES if not o.startswith(("save_policy", "data.")))


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", PAGE.read_text(), re.S)


def shorten(command: str) -> str:
    """A command of the page (continuation lines joined) with few steps and the fast tiny model."""
    if "src/train.py" in command:
        return re.sub(r"trainer\.max_steps=\d+", "trainer.max_steps=2", command) + f" {FAST}"
    if "src/eval.py" in command:
        return f"{command} eval.max_prompts=4 eval.num_samples=2"
    return command


def test_the_page_shows_a_reward_file_and_selects_it_on_the_command_line():
    (code,) = blocks("python")
    assert code.startswith("# my_reward.py\n") and "def reward(completions, answer, **kwargs)" in code
    bash = "\n".join(blocks("bash"))
    assert bash.count("+verifier.reward_funcs={mine: {_target_: my_reward.reward, _partial_: true}}") == 2
    assert "src/train.py" in bash and "src/eval.py" in bash and "data=jsonl" in bash


@pytest.mark.slow
def test_every_block_of_the_own_data_guide_runs_in_a_real_shell(tmp_path):
    repo = tmp_path / "grpolab"  # the checkout's files, linked: the page's files and outputs land here
    repo.mkdir()
    for part in ("src", "conf"):
        (repo / part).symlink_to(REPO_ROOT / part)
    (code,) = blocks("python")
    (repo / code.splitlines()[0].removeprefix("# ").strip()).write_text(code)
    env = {**os.environ, "GRPOLAB_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}
    env.pop("PYTHONPATH", None)  # the page says the working directory is enough
    env = shell_env(env, tmp_path / "bin")  # `python src/train.py` and `src/eval.py` fork (forkrun_shell.py)
    for block in blocks("bash"):
        commands = block.replace("\\\n", " ").strip().splitlines() if "src/" in block else [block]
        script = "set -euo pipefail\n" + "\n".join(shorten(c) for c in commands)
        res = subprocess.run(["bash", "-c", script], cwd=repo, env=env, text=True, capture_output=True, timeout=900)
        assert res.returncode == 0, f"{block}\n{res.stderr[-3000:]}"
    assert sum(1 for _ in open(repo / "products.jsonl")) == 300
    run = repo / "outputs" / "products"
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert "train/rewards/mine/mean" in rows[0] and "train/rewards/exact/mean" not in rows[0]
    assert any(r["train/rewards/mine/mean"] not in ("", "nan") for r in rows)
    (eval_json,) = repo.glob("outputs/eval/*/eval.json")
    assert json.loads(eval_json.read_text())["verifier"] == ["mine"]
