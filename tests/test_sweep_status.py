"""sweeps/sweep_status.py --csv, the record of a screen's results: rows come from runs that finished with every
number they owe, a rerun of the export leaves the file as it was, and a second row for a key is refused, named.
Hand-written job folders, as src/train.py leaves them (.hydra/overrides.yaml and config.yaml, summary.json)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
import yaml
from conftest import REPO_ROOT

GRID = ["correction_arm=onpolicy,k10_ppo", "seed=0,1"]
CONFIG = {"trainer": {"max_steps": 10}, "final_eval": {"enabled": True, "split": "test", "num_samples": 16}}


def _job(sweep, name, arm, seed, summary, config=CONFIG):
    job = sweep / name
    (job / ".hydra").mkdir(parents=True, exist_ok=True)
    (job / ".hydra" / "overrides.yaml").write_text(f"- correction_arm={arm}\n- seed={seed}\n")
    (job / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    if summary is not None:
        (job / "summary.json").write_text(summary if isinstance(summary, str) else json.dumps(summary))
    return job


def _finished(seed, score, start=0.297, **extra):
    return {"seed": seed, "steps": 10, "interrupted": False, "failed": False, "val_accuracy_start": start,
            "test_mean_at_16": score, "test_mean_at_16_se": 0.01, "time_total_s": 12.5, **extra}


def _export(sweep, out, *grid):
    return subprocess.run([sys.executable, "sweeps/sweep_status.py", str(sweep), "--csv", str(out), *(grid or GRID)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)


def _rows(path):
    with path.open() as fh:
        return list(csv.DictReader(fh))


def test_a_job_that_failed_short_is_not_a_row_and_its_finished_row_is_added_once_it_finishes(tmp_path):
    """Issue 39 (item 5): a sampler failure at step 3 of 10 wrote a summary (interrupted: false, no score); the
    export appended it, then refused the job's finished row as already there ("0 rows added")."""
    sweep, out = tmp_path / "sweep", tmp_path / "results.csv"
    _job(sweep, "0_onpolicy_0", "onpolicy", 0, _finished(0, 0.5))
    failed = {"seed": 1, "steps": 3, "interrupted": False, "failed": True, "val_accuracy_start": 0.297,
              "failure": {"step": 3, "reason": "the sampler died"}, "time_total_s": 4.0}
    job = _job(sweep, "1_onpolicy_1", "onpolicy", 1, failed)
    # finished training, but the final eval owed by final_eval.enabled never wrote its score (stopped in it)
    _job(sweep, "2_k10_ppo_0", "k10_ppo", 0, {**_finished(0, None), "signal": "SIGTERM", "stopped_in": "final eval"})
    res = _export(sweep, out)
    assert res.returncode == 0, res.stderr
    assert f"1 rows added to {out}" in res.stdout, res.stdout
    assert [(r["arm"], r["seed"]) for r in _rows(out)] == [("onpolicy", "0")]
    (job / "summary.json").write_text(json.dumps(_finished(1, 0.625)))  # the rerun resumed it to the end
    res = _export(sweep, out)
    assert f"1 rows added to {out}" in res.stdout, res.stdout
    rows = _rows(out)
    assert [(r["arm"], r["seed"], r["steps"], r["test_mean_at_16"]) for r in rows] == [
        ("onpolicy", "0", "10", "0.5"), ("onpolicy", "1", "10", "0.625")]


def test_a_finished_row_never_replaces_a_different_row_of_its_key_silently(tmp_path):
    """Issue 39 (item 5): a results file that holds a row for the key (written before, from an unfinished run)
    is left as it is, and the export names the key and both rows."""
    sweep, out = tmp_path / "sweep", tmp_path / "results.csv"
    _job(sweep, "0_onpolicy_0", "onpolicy", 0, _finished(0, 0.5))
    out.write_text("arm,seed,steps,test_mean_at_16,val_accuracy_start\nonpolicy,0,3,,0.297\n")
    before = out.read_bytes()
    res = _export(sweep, out)
    assert res.returncode == 1, res.stdout + res.stderr
    line = next(x for x in res.stdout.splitlines() if x.startswith("refused"))
    assert "arm=onpolicy, seed=0, val_accuracy_start=0.297" in line
    assert f"{out.name} line 2" in line and "0_onpolicy_0" in line
    assert f"0 rows added to {out}" in res.stdout
    assert out.read_bytes() == before


def test_the_export_is_idempotent_when_the_start_accuracy_is_zero(tmp_path):
    """Issue 39 (item 14): `str(start or "")` made a val_accuracy_start of 0.0 the key "" while the file holds
    "0.0": every rerun of the export appended the same rows again."""
    sweep, out = tmp_path / "sweep", tmp_path / "results.csv"
    _job(sweep, "0_onpolicy_0", "onpolicy", 0, _finished(0, 0.5, start=0.0))
    _job(sweep, "1_k10_ppo_0", "k10_ppo", 0, _finished(0, 0.25, start=0.0))
    assert "2 rows added" in _export(sweep, out).stdout
    first = out.read_bytes()
    for _ in range(2):
        res = _export(sweep, out)
        assert res.returncode == 0 and f"0 rows added to {out}" in res.stdout, res.stdout
        assert out.read_bytes() == first


def test_two_job_folders_of_one_key_are_refused_with_the_key_and_both_folders(tmp_path):
    """Issue 39 (item 12): the same grid point in two folders (a batch run twice) is named, and neither is kept."""
    sweep, out = tmp_path / "sweep", tmp_path / "results.csv"
    _job(sweep, "a/0_onpolicy_0", "onpolicy", 0, _finished(0, 0.5))
    _job(sweep, "b/0_onpolicy_0", "onpolicy", 0, _finished(0, 0.75))
    _job(sweep, "b/1_onpolicy_1", "onpolicy", 1, _finished(1, 0.5))
    res = _export(sweep, out)
    assert res.returncode == 1
    refused = [x for x in res.stdout.splitlines() if x.startswith("refused")]
    assert len(refused) == 1 and "arm=onpolicy, seed=0" in refused[0], res.stdout
    assert "a/0_onpolicy_0" in refused[0] and "b/0_onpolicy_0" in refused[0]
    assert [(r["arm"], r["seed"]) for r in _rows(out)] == [("onpolicy", "1")]


def test_a_half_written_summary_is_a_job_not_finished_with_one_warning(tmp_path):
    """Issue 39 (item 13): an unreadable summary.json is read as not finished, named once, never a traceback."""
    sweep, out = tmp_path / "sweep", tmp_path / "results.csv"
    _job(sweep, "0_onpolicy_0", "onpolicy", 0, _finished(0, 0.5))
    job = _job(sweep, "1_onpolicy_1", "onpolicy", 1, json.dumps(_finished(1, 0.5))[:40])
    res = _export(sweep, out)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    warnings = [x for x in (res.stdout + res.stderr).splitlines() if str(job / "summary.json") in x]
    assert len(warnings) == 1 and "not finished" in warnings[0], res.stdout + res.stderr
    assert [(r["arm"], r["seed"]) for r in _rows(out)] == [("onpolicy", "0")]


def test_a_row_holds_the_lr_greedy_accuracy_pass_at_k_and_final_entropy_and_older_files_stay_readable(tmp_path):
    """Issue 42 (item 3): the lr a run trained at (a fixed override, not a grid key, was in no row), its final
    greedy accuracy and pass@k beside mean@16, and the final entropy of its training completions (metrics.csv's
    train/entropy over the last 10 optimizer steps) land in the row; a file written before them keeps its rows and
    a rerun of the export leaves it as it was."""
    sweep, out = tmp_path / "sweep", tmp_path / "results.csv"
    job = _job(sweep, "0_onpolicy_0", "onpolicy", 0, _finished(0, 0.5, learning_rate=1e-4, test_greedy_accuracy=0.75,
                                                                test_pass_at_4=0.8125, test_pass_at_16=0.9375,
                                                                test_num_prompts=16, val_greedy_accuracy_end=0.5))
    # 12 train rows (steps 0-11; the last 10 are steps 2-11, entropies 0.2 .. 1.1) and a validation row between
    lines = ["epoch,step,train/entropy,val/accuracy"] + [f"0,{s},{0.1 * s:.1f}," for s in range(12)] + ["0,11,,0.5"]
    (job / "metrics.csv").write_text("\n".join(lines) + "\n")
    _job(sweep, "1_onpolicy_1", "onpolicy", 1, _finished(1, 0.625))  # an older run: none of them
    res = _export(sweep, out)
    assert res.returncode == 0 and "2 rows added" in res.stdout, res.stdout + res.stderr
    new, old = _rows(out)
    assert float(new["learning_rate"]) == 1e-4 and new["test_greedy_accuracy"] == "0.75"
    assert (new["test_pass_at_4"], new["test_pass_at_16"]) == ("0.8125", "0.9375")
    assert float(new["train_entropy_end"]) == pytest.approx(sum(0.1 * s for s in range(2, 12)) / 10)
    assert "test_num_prompts" not in new and "val_greedy_accuracy_end" not in new  # the final eval's scores only
    assert old["learning_rate"] == old["train_entropy_end"] == old["test_pass_at_16"] == ""
    assert new["drift_refreshes"] == old["drift_refreshes"] == "0"  # no drift rule: no drift refresh (issue 41)
    # a file written before the new columns: its rows are kept, the export adds none and changes nothing
    legacy = tmp_path / "legacy.csv"
    legacy.write_text("arm,seed,steps,test_mean_at_16,test_mean_at_16_se,val_accuracy_start,clip_mode,"
                      "async_generation,drift_refreshes,time_total_s\nonpolicy,0,10,0.5,0.01,0.297,,,0,12.5\n"
                      "onpolicy,1,10,0.625,0.01,0.297,,,0,12.5\n")
    before = legacy.read_bytes()
    res = _export(sweep, legacy)
    assert res.returncode == 0 and f"0 rows added to {legacy}" in res.stdout, res.stdout
    assert legacy.read_bytes() == before


def test_a_rerun_refused_for_other_settings_reads_as_refused_not_as_jobs_to_run(tmp_path):
    """A rerun with another model.path (a key folder names leave out) is refused job by job, but Hydra has rewritten
    the sweep's multirun.yaml: its points read "refused", naming the folder and the keys, with no rerun line that
    would be refused again (a new user followed it in a loop)."""
    sweep = tmp_path / "sweep"
    _job(sweep, "0_onpolicy_0", "onpolicy", 0, _finished(0, 0.5))
    hydra = {"hydra": {"overrides": {"task": ["correction_arm=onpolicy", "seed=0", "model.path=/w/policy"],
                                     "hydra": []}, "sweeper": {"params": None}, "job": {"config_name": "train"},
                       "runtime": {"config_sources": []}}}
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(hydra))
    res = subprocess.run([sys.executable, "sweeps/sweep_status.py", str(sweep)], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=120)
    out = " ".join(res.stdout.split())
    assert res.returncode == 0 and "1 finished, 1 refused" in out, res.stdout + res.stderr
    assert ("(its folder 0_onpolicy_0 holds a run with other settings: model.path=(default) there, /w/policy asked)"
            in out) and "run those settings with a new hydra.sweep.dir" in out
    assert "not started" not in out and "to finish, rerun" not in out


def test_a_key_the_grid_sweeps_tells_jobs_apart_and_is_not_read_as_other_settings():
    """``data.path=a,b`` in one grid: the job of ``b`` not started yet is a job to run, not a refusal by ``a``'s
    folder, though folder names leave data.path out."""
    sys.path.insert(0, str(REPO_ROOT / "sweeps"))
    import sweep_status

    jobs = [{"dir": "0_seed-0", "overrides": {"seed": "0", "data.path": "a"}}]
    assert sweep_status.held_by_other_settings({"seed": "0", "data.path": "b"}, jobs, {"data.path"}) is None
    held = sweep_status.held_by_other_settings({"seed": "0", "data.path": "b"}, jobs)
    assert held is not None and held[1] == "data.path=a there, b asked"
