"""A checkpoint is never unpickled with code: a crafted ``ckpt_path`` whose pickle calls ``os.system`` is refused by
preflight (train) and by eval with a one-line error naming the path, on the command line too (exit 2), and the
command never runs; the project's own checkpoints still load, resume and evaluate."""

import os
import sys

import forkrun
import pytest
import torch
from conftest import FAST_OVERRIDES, REPO_ROOT, compose_train_cfg

from grpolab.app.preflight import check_saved_rollout, preflight
from grpolab.app.run import run_training
from grpolab.checkpoint.reading import check_resume_steps, load_checkpoint
from grpolab.config import GRPOConfig
from grpolab.errors import ConfigError
from grpolab.evaluation.evaluate import evaluate

EVAL = [*[o for o in FAST_OVERRIDES if o.startswith(("model.", "data."))], "eval.progress_bar=false",
        "eval.num_samples=2", "eval.max_prompts=8"]


class _RunsCode:
    """Pickles as a call of ``os.system(command)``: what a malicious checkpoint would hold."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


@pytest.fixture
def crafted(tmp_path):
    """A Lightning-looking checkpoint whose unpickling would create ``marker``."""
    marker = tmp_path / "marker"
    path = tmp_path / "crafted.ckpt"
    torch.save({"global_step": 1, "state_dict": {}, "grpolab": _RunsCode(f"touch {marker}")}, path)
    return path, marker


def _refused(excinfo, path) -> None:
    msg = str(excinfo.value)
    assert msg.startswith(f"ckpt_path={path}: refused to load") and "\n" not in msg
    assert "posix.system" in msg  # what it tried to call


def test_train_preflight_refuses_a_checkpoint_that_runs_code(tmp_path, crafted):
    path, marker = crafted
    cfg = compose_train_cfg(tmp_path / "run", [*FAST_OVERRIDES, "trainer.max_steps=4", f"ckpt_path={path}"])
    with pytest.raises(ConfigError) as excinfo:
        preflight(cfg)
    _refused(excinfo, path)
    with pytest.raises(ConfigError):
        check_resume_steps(path, 4)
    with pytest.raises(ConfigError):
        check_saved_rollout(str(path), GRPOConfig(), {"devices": 1, "num_nodes": 1}, False)
    assert not marker.exists()
    # the file really runs its command when unpickled unsafely: the checks above were not vacuous
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_eval_refuses_a_checkpoint_that_runs_code(tmp_path, crafted):
    path, marker = crafted
    with pytest.raises(ConfigError) as excinfo:
        evaluate(compose_train_cfg(tmp_path / "eval", [*EVAL, f"ckpt_path={path}"], config_name="eval"))
    _refused(excinfo, path)
    assert not marker.exists()


@pytest.mark.parametrize("script", ["src/train.py", "src/eval.py"])
def test_entry_points_refuse_a_checkpoint_that_runs_code_in_one_line(tmp_path, crafted, script):
    path, marker = crafted
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}
    env.pop("GRPOLAB_TRACEBACK", None)
    overrides = FAST_OVERRIDES if script == "src/train.py" else [o for o in FAST_OVERRIDES if o.startswith("model.")]
    cmd = [sys.executable, script, f"ckpt_path={path}", f"hydra.run.dir={tmp_path / 'run'}",
           f"paths.cache_dir={tmp_path / 'cache'}", *overrides]
    out = forkrun.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert not marker.exists(), "the checkpoint's pickle ran a command"
    assert out.returncode == 2, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert "refused to load" in last and str(path) in last


def test_own_checkpoints_load_safely_resume_and_evaluate(tmp_path):
    common = [*FAST_OVERRIDES, "algo.beta=0.04", "val.at_start=false", "trainer.val_check_interval=100"]
    run_training(compose_train_cfg(tmp_path / "run", [*common, "trainer.max_steps=2"]))
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert load_checkpoint(last)["global_step"] == 2
    cfg = compose_train_cfg(tmp_path / "resumed", [*common, "trainer.max_steps=3", f"ckpt_path={last}"])
    assert preflight(cfg).algo.beta == 0.04
    assert run_training(cfg)["steps"] == 3
    result = evaluate(compose_train_cfg(tmp_path / "eval", [*EVAL, f"ckpt_path={last}"], config_name="eval"))
    assert 0.0 <= result["accuracy"] <= 1.0
