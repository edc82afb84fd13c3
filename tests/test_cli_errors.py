"""User errors on the real command line: one line on stderr naming the key and the fix, exit status 2, no traceback.

The command lines run concurrently (one module fixture), so the file costs about one start-up of
``src/train.py`` per core, not one per case.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import forkrun
import pytest
from conftest import FAST_OVERRIDES, REPO_ROOT, compose_train_cfg

from grpolab.app.cli import one_line, unknown_overrides
from grpolab.app.run import build
from grpolab.errors import ConfigError, ConfigPathError

VLLM_ASYNC_IS = ["rollout=vllm", "rollout.async_generation=true", "algo.vllm_importance_sampling_correction=true"]

# name -> (script, arguments, extra environment, what the last stderr line must contain). One case per way a user
# error reaches the command line (a config check, Hydra's own parsing, the eval entry point); every other check,
# and the one line a multi-line message becomes, is asserted in process below, through the same preflight.
CASES = {
    "wrong_type": ("src/train.py", ["trainer.max_steps=abc"], {},
                   ["train.py: error: trainer.max_steps must be an integer, got 'abc'"]),
    "typo": ("src/train.py", ["algo.epsilonn=0.3"], {},
             ["algo.epsilonn is not a key of the config; did you mean algo.epsilon"]),
    "typo_multirun": ("src/train.py", ["-m", "seed=0,1", "algo.epsilonn=0.1,0.2", "trainer.zzzzqq=1"], {},
                      ["algo.epsilonn is not a key of the config; did you mean algo.epsilon",
                       "trainer.zzzzqq is not a key of the config and no existing key is close to it",
                       "to add a new key write +trainer.zzzzqq=1"]),
    "warmstart_patience": ("src/train.py", ["model.warmstart.patience=0"], {},
                           ["train.py: error: model.warmstart.patience must be null (never stop early) or an "
                            "integer >= 1 (evaluations without a gain), got 0"]),
    "eval_missing_data_path": ("src/eval.py", ["data=jsonl"], {}, ["eval.py: error: data.path is required"]),
    # refused after the memory plan was logged (a missing data file is checked last): the folder keeps its log
    "missing_data_file": ("src/train.py", ["data=jsonl", "data.path=/nonexistent/missing.jsonl"], {},
                          ["/nonexistent/missing.jsonl"]),
    "traceback_env": ("src/eval.py", ["data=jsonl"], {"GRPOLAB_TRACEBACK": "1"}, []),  # the cheaper entry point
}


def _run(tmp, name: str) -> subprocess.CompletedProcess:
    script, args, env, _ = CASES[name]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline", **env}
    for var in ("HYDRA_FULL_ERROR", "GRPOLAB_TRACEBACK"):
        if var not in CASES[name][2]:
            env.pop(var, None)
    cmd = [sys.executable, script, *args, f"hydra.run.dir={tmp / name}", f"hydra.sweep.dir={tmp / name}",
           f"paths.cache_dir={tmp / 'cache'}"]
    return forkrun.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cli_errors")


@pytest.fixture(scope="module")
def runs(runs_dir) -> dict[str, subprocess.CompletedProcess]:
    tmp = runs_dir
    with ThreadPoolExecutor(max_workers=max(2, min(len(CASES), os.cpu_count() or 2))) as pool:
        return dict(zip(CASES, pool.map(lambda n: _run(tmp, n), CASES), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in CASES if n != "traceback_env"])
def test_a_user_error_is_one_line_naming_the_key_and_the_fix(runs, runs_dir, name):
    proc = runs[name]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert lines, proc.stdout[-2000:]
    for part in CASES[name][3]:
        assert part in lines[-1], lines[-1]
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output and "Error in call to target" not in output
    assert "HYDRA_FULL_ERROR" not in output and "To append to your config use" not in output
    assert "instantiating" not in output  # found before anything was built
    # train.py leaves no run folder behind for a refused config (only Hydra's record and an empty log would be in
    # it); one refused after the memory plan was logged keeps its log, which holds the plan
    folder = runs_dir / name
    if name == "missing_data_file":
        assert "memory plan" in (folder / "train.log").read_text()
    elif CASES[name][0] == "src/train.py":
        assert not folder.exists(), sorted(p.name for p in folder.rglob("*"))


@pytest.mark.slow
def test_the_env_var_brings_the_traceback_back(runs):
    proc = runs["traceback_env"]
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "data.path is required" in proc.stderr


@pytest.mark.parametrize("override,cls,message", [
    ("data=jsonl", ConfigError, r"data\.path is required and not set: add data\.path=<value>"),
    ("data=jsonl data.path=/nope/train.jsonl", ConfigPathError, r"data\.path=/nope/train\.jsonl: no such file"),
    ("data.test_path=/nope/test.jsonl", ConfigPathError, r"data\.test_path=/nope/test\.jsonl: no such file .*"
                                                         r"or data\.test_path=null"),
    ("model.path=/nope/model", ConfigPathError, r"model\.path=/nope/model: the folder does not exist"),
    ("model.lora.r=4 algo.ref_refresh_every=5", ConfigError, r"set algo\.ref_refresh_every=null, or model\.lora\.r=null"),
    ("+algo.epsilonn=0.3", ConfigError, r"algo\.epsilonn \(did you mean algo\.epsilon or algo\.epsilon_high\?\)"),
    ("algo.num_generations=1", ConfigError, r"algo\.num_generations must be >= 2"),
    ("rollout.cache_implementation=foo", ConfigError, r"rollout\.cache_implementation must be one of dynamic, "
                                                      r"preallocated, got 'foo'"),
    ("model=qwen0.5b model.path=/nonexistent/model plan.check=false", ConfigPathError,
     r"model\.path=/nonexistent/model: the folder does not exist.*give an existing Hugging Face model folder"),
])
def test_paths_and_combinations_are_config_errors_before_any_model(tmp_path, override, cls, message):
    data = ["data=jsonl", f"data.path={REPO_ROOT / 'pyproject.toml'}"] if "test_path" in override else []
    fast = [] if override.startswith("model=") else FAST_OVERRIDES  # the tiny model's keys
    cfg = compose_train_cfg(tmp_path, [*fast, *data, *override.split()])
    with pytest.raises(cls, match=message):
        build(cfg)
    assert not (tmp_path / "cache").exists()  # nothing was built


def test_a_multi_line_combination_error_becomes_one_line(tmp_path):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *VLLM_ASYNC_IS])
    with pytest.raises(ConfigError) as err:
        build(cfg)
    line = one_line(str(err.value))  # what report_user_errors prints after "train.py: error: "
    assert "\n" not in line and "rollout.async_generation=true" in line
    assert ("set rollout.recompute_sampler_logp=false and algo.vllm_importance_sampling_correction=false, or "
            "rollout.async_generation=false") in line
    assert not (tmp_path / "cache").exists()  # nothing was built


def test_unknown_overrides_leave_good_command_lines_alone():
    conf = REPO_ROOT / "conf"
    good = ["-m", "algo=grpo_onpolicy,grpo_offpolicy", "seed=0,1", "+algo.new_key=1", "++seed=3",
            "model.lora.r=4", "hydra.run.dir=x", "trainer=gpu"]
    assert unknown_overrides(conf, "train", good) == []
    assert unknown_overrides(conf, "train", ["algo=grpo_offpolic"]) == [
        "algo=grpo_offpolic is not an option of algo; the options: " + ", ".join(
            sorted(f.stem for f in (conf / "algo").glob("*.yaml"))) + "; did you mean algo=grpo_offpolicy?"]
    assert unknown_overrides(conf, "train", ["-m", "seed=0", "hydra/launcher=jobllib"])[0].startswith(
        "hydra/launcher=jobllib is not an option of hydra/launcher; the options: basic, joblib, slurm")
    assert unknown_overrides(conf, "train", ["seed=0,1"]) == []  # Hydra: a sweep needs --multirun
    assert unknown_overrides(conf, "train", ["algoo.epsilon=0.1"]) == [
        "algoo.epsilon is not a key of the config; did you mean algo.epsilon?"]
    assert unknown_overrides(conf, "eval", ["eval.num_sample=3"]) == [
        "eval.num_sample is not a key of the config; did you mean eval.num_samples?"]
    assert one_line("invalid:\n  a\n  b") == "invalid: a; b"
