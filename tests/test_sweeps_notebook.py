"""The on/off-policy sweep: its configs compose into the intended grid, the real multirun command runs a tiny
version of it, and the analysis notebook renders its figures from that output."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT

SWEEPS = REPO_ROOT / "sweeps"
ARMS = {  # arm -> (algo name, k, i, mask)
    "k1": ("grpo_onpolicy", 1, 1, False),
    "k1_mask": ("grpo_onpolicy", 1, 1, True),
    "k2": ("grpo_offpolicy", 2, 1, True),
    "k4": ("grpo_offpolicy", 4, 1, True),
    "k10": ("grpo_offpolicy", 10, 1, True),
    "k10_anchor": ("grpo_offpolicy", 10, 1, True),
    "reuse_i10": ("grpo_reuse", 1, 10, False),
}


def compose_sweep(name: str, overrides: list[str]):
    """Compose a sweep config as `python src/train.py --config-dir sweeps --config-name <name>` does."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(SWEEPS), version_base="1.3"):
        return compose(config_name=name, overrides=[f"hydra.searchpath=[file://{REPO_ROOT / 'conf'}]", *overrides],
                       return_hydra_config=True)


def grid(cfg) -> dict[str, list[str]]:
    return {k: str(v).split(",") for k, v in cfg.hydra.sweeper.params.items()}


@pytest.mark.parametrize("name,seeds,steps", [("onoff", ["0", "1", "2"], 1000), ("onoff_small", ["0", "1"], 200)])
def test_sweep_grid_is_the_papers_comparison(name, seeds, steps):
    cfg = compose_sweep(name, [])
    assert cfg.hydra.mode.name == "MULTIRUN"
    assert grid(cfg) == {"arm": list(ARMS), "seed": seeds}
    assert cfg.trainer.max_steps == steps and cfg.task_name == name
    assert cfg.model.seed == 0 and cfg.data.seed == 0  # one warm start and one split shared by every job
    assert cfg.callbacks.threads.num_threads == 1  # no CPU oversubscription on a shared machine


@pytest.mark.parametrize("arm", list(ARMS))
def test_each_arm_selects_its_regime(arm):
    from omegaconf import OmegaConf

    from grpolab.config import GRPOConfig

    cfg = compose_sweep("onoff", [f"arm={arm}", "seed=2"])
    algo = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))
    assert (algo.name, algo.steps_per_generation, algo.num_iterations, algo.mask_zero_std_groups) == ARMS[arm]
    assert algo.clip_mode == ("offpolicy_grpo" if algo.name == "grpo_offpolicy" else "ppo")
    assert algo.ratio_reference == ("anchor" if arm == "k10_anchor" else "sampler")
    assert cfg.seed == 2 and cfg.trainer.max_steps == 1000  # the same number of optimizer steps for every arm


def test_every_arm_file_is_in_the_grid():
    claim = grid(compose_sweep("claim", []))["arm"]  # the claim study's ablations (tests/test_claim_sweep.py)
    assert sorted(p.stem for p in (SWEEPS / "arm").glob("*.yaml")) == sorted(set(ARMS) | set(claim))


def test_wandb_sweep_file_covers_the_same_grid():
    spec = yaml.safe_load((SWEEPS / "onoff_wandb.yaml").read_text())
    hydra_grid = grid(compose_sweep("onoff", []))
    assert spec["method"] == "grid" and spec["program"] == "src/train.py"
    assert [str(v) for v in spec["parameters"]["arm"]["values"]] == hydra_grid["arm"]
    assert [str(v) for v in spec["parameters"]["seed"]["values"]] == hydra_grid["seed"]
    command = spec["command"]
    assert "--config-name=onoff" in command and "hydra.mode=RUN" in command and "logger=wandb" in command
    assert command[-1] == "${args_no_hyphens}"  # arm=<a> seed=<s> as Hydra overrides
    # what an agent runs composes as one job of the grid
    cfg = compose_sweep("onoff", [c for c in command if re.match(r"^[\w.]+=", c)] + ["arm=k10", "seed=1"])
    assert cfg.algo.steps_per_generation == 10 and cfg.logger.wandb.group == "onoff-wandb"
    assert list(cfg.logger.wandb.auto_tags) == ["algo=grpo_offpolicy", "k=10", "i=1", "mask=True", "seed=1"]


@pytest.mark.slow
def test_tiny_sweep_runs_every_job(tiny_sweep):
    import json

    jobs = sorted(p for p in tiny_sweep.iterdir() if p.is_dir())
    assert [p.name.split("_")[0] for p in jobs] == ["0", "1", "2", "3"]  # <num>_<overrides>
    assert jobs[0].name.startswith("0_seed-0+") and "arm-k1+" in jobs[0].name  # conf/hydra/default.yaml override_dirname
    summaries = [json.loads((p / "summary.json").read_text()) for p in jobs]
    assert [(s["steps_per_generation"], s["seed"]) for s in summaries] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert all(s["steps"] == 4 for s in summaries) and [s["sampler_refreshes"] for s in summaries] == [4, 4, 2, 2]
    for p in jobs:
        assert (p / "metrics.csv").exists() and (p / ".hydra" / "config.yaml").exists()
        assert (p / "completions.jsonl").exists()  # the completions callback of conf/callbacks/default.yaml


def test_notebook_renders_the_sweep(tiny_sweep, tmp_path):
    import nbformat

    figures = tmp_path / "figures"
    relative = os.path.relpath(tiny_sweep, REPO_ROOT)  # as the README names it: relative to the repository root
    proc = subprocess.run([sys.executable, "notebooks/render.py", relative, "--figures", str(figures)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    pngs = sorted(p.name for p in figures.glob("*.png"))
    assert pngs == ["diagnostics.png", "final_accuracy.png", "final_test_accuracy.png", "refreshes_and_time.png",
                    "reward_and_accuracy.png", "weight_stats_by_lag.png"]
    assert all((figures / p).stat().st_size > 10_000 for p in pngs)
    assert sorted(Path(line).name for line in proc.stdout.split()) == pngs
    table = (figures / "final_accuracy.csv").read_text()
    assert "k=1 on-policy" in table and "k=2" in table
    test_table = (figures / "final_test_accuracy.csv").read_text()  # mean +- se and the gap to k=1
    assert "test_mean_at_2" in test_table and "paired diff vs on-policy" in test_table
    assert "se of paired diff" in test_table and test_table.splitlines()[-1].endswith(",2.0")  # both seeds paired
    lags = (figures / "weight_stats_by_lag.csv").read_text()
    assert "train/ratio/grad_weight_frac_above_2" in lags and "k=2" in lags
    nb = nbformat.read(figures / "onpolicy_vs_offpolicy.ipynb", as_version=4)  # the executed copy
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if o.get("name") == "stdout")
    assert "4 runs in 2 arms" in text


def test_notebook_has_no_outputs_in_git():
    import nbformat

    nb = nbformat.read(REPO_ROOT / "notebooks" / "onpolicy_vs_offpolicy.ipynb", as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
    nbformat.validate(nb)


def test_render_refuses_a_folder_without_runs(tmp_path):
    proc = subprocess.run([sys.executable, "notebooks/render.py", str(tmp_path)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "no summary.json" in proc.stderr
