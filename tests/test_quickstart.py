"""Every shell block of the README's Quickstart runs through a real shell (bash), in order, in a folder linking the
repository's files, so a quoting error (an override whose quotes the shell strips) cannot come back. Its
``python src/train.py`` and ``python src/eval.py`` fork from the tests' fork server (``forkrun_shell.py``;
``GRPOLAB_TEST_FORK=0``: real processes).

To keep it short each training line gets the tiny fast overrides and fewer steps (the same proportions, so
the resume step still lies past the checkpoint), and the eval line scores a few prompts. The install block is
only parsed (``bash -n``): the environment running the tests is already installed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from conftest import FAST_OVERRIDES, REPO_ROOT
from forkrun_shell import shell_env

FAST = " ".join(o for o in FAST_OVERRIDES if not o.startswith("save_policy"))


def quickstart_blocks() -> list[str]:
    """The ```bash blocks between the README's '## Quickstart' and the next '## ' heading."""
    text = (REPO_ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def shorten(line: str) -> str:
    """A quickstart command with fewer steps and the fast tiny model."""
    if "src/train.py" in line:
        steps = re.search(r"trainer\.max_steps=(\d+)", line)
        if steps:
            line = line.replace(steps.group(0), f"trainer.max_steps={max(2, int(steps.group(1)) // 200)}")
        else:
            line = f"{line} trainer.max_steps=4"
        return f"{line} {FAST}"
    if "src/eval.py" in line:
        return f"{line} eval.max_prompts=4 eval.num_samples=2"
    return line


def test_quickstart_has_the_steps_it_promises():
    blocks = quickstart_blocks()
    assert len(blocks) >= 5
    assert any("pip install" in b for b in blocks) and any("src/eval.py" in b for b in blocks)
    assert any("ckpt_path=" in b for b in blocks) and any(" -m " in b for b in blocks)


@pytest.mark.slow
def test_every_quickstart_block_runs_in_a_real_shell(tmp_path):
    repo = tmp_path / "grpolab"  # the checkout's files, linked: the outputs land here, not in the checkout
    repo.mkdir()
    for part in ("src", "conf", "notebooks", "sweeps", "README.md"):  # sweeps/report.py: step 6's table
        (repo / part).symlink_to(REPO_ROOT / part)
    (tmp_path / "shared").symlink_to(REPO_ROOT.parent / "shared")
    env = {**os.environ, "GRPOLAB_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline", "PYTHONPATH": str(repo / "src")}
    env = shell_env(env, tmp_path / "bin")  # `python src/train.py` and `src/eval.py` fork (forkrun_shell.py)
    for block in quickstart_blocks():
        if "pip install" in block:
            check = subprocess.run(["bash", "-n"], input=block, text=True, capture_output=True)
            assert check.returncode == 0, check.stderr
            continue
        script = "set -euo pipefail\n" + "\n".join(shorten(line) for line in block.strip().splitlines())
        res = subprocess.run(["bash", "-c", script], cwd=repo, env=env, text=True, capture_output=True, timeout=600)
        assert res.returncode == 0, f"{block}\n{res.stderr[-3000:]}"
    assert list(repo.glob("outputs/smoke/*/summary.json")) and list(repo.glob("outputs/eval/*/eval.json"))
    assert len(list(repo.glob("outputs/train/*/summary.json"))) == 2  # the default run and its resume
    assert list(repo.glob("multirun/compare/*/figures/*.png"))
    assert "paired diff vs `algo=grpo_onpolicy`" in next(repo.glob("multirun/compare/*/report/report.md")).read_text()
    # the Hydra multirun of step 6: one job per (algo, seed), each with its own schedule (2 steps here)
    compare = [json.loads(p.read_text()) for p in repo.glob("multirun/compare/*/*/summary.json")]
    assert sorted((s["algo"], s["seed"]) for s in compare) == [
        ("grpo_offpolicy", 0), ("grpo_offpolicy", 1), ("grpo_onpolicy", 0), ("grpo_onpolicy", 1)]
    for s in compare:  # k=1 refreshes the sampler every step; k=10 once in 2 steps
        assert s["steps"] == 2 and s["sampler_refreshes"] == (2 if s["algo"] == "grpo_onpolicy" else 1)
