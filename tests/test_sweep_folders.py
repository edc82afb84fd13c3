"""Which sweep the notebook and ``notebooks/render.py`` read (sweeps/sweep_folders.py): with none named, the newest
folder of job folders under ``multirun/`` (never a job folder), or an error that says what to pass; a relative
path is read from the repository root, also by the notebook itself, which runs in ``notebooks/``."""

from __future__ import annotations

import json
import os
import sys

import pytest
from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "sweeps"))
from sweep_folders import newest_sweep, resolve, sweep_dir  # noqa: E402


def _job(folder, mtime):
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"steps": 2}))
    os.utime(folder / "summary.json", (mtime, mtime))


def test_the_newest_sweep_is_a_folder_of_jobs_not_a_job(tmp_path):
    multirun = tmp_path / "multirun"
    _job(multirun / "compare" / "2026-01-01_10-00-00" / "0_seed-0+algo-grpo_onpolicy", 1000)
    _job(multirun / "compare" / "2026-01-01_10-00-00" / "1_seed-1+algo-grpo_onpolicy", 1100)
    _job(multirun / "grid" / "0_seed-0", 2000)  # hydra.sweep.dir=multirun/grid: the jobs one level up
    assert newest_sweep(multirun) == multirun / "grid"
    _job(multirun / "compare" / "2026-01-02_10-00-00" / "0_seed-0", 3000)
    (multirun / "grid" / "figures").mkdir()  # rendering an old sweep does not make it the newest
    assert newest_sweep(multirun) == multirun / "compare" / "2026-01-02_10-00-00"
    assert sweep_dir(None, tmp_path) == newest_sweep(multirun)


def test_no_sweep_is_an_error_that_says_what_to_pass(tmp_path):
    (tmp_path / "multirun").mkdir()
    with pytest.raises(FileNotFoundError, match="no sweep folder under .*python notebooks/render.py <sweep>"):
        sweep_dir(None, tmp_path)


def test_a_relative_path_is_read_from_the_repository_root(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT / "notebooks")  # where the notebook runs
    assert resolve("multirun/compare/x") == REPO_ROOT / "multirun" / "compare" / "x"
    assert resolve("../sweeps") == REPO_ROOT / "sweeps"  # there from here: read as given
    assert resolve(tmp_path) == tmp_path


def test_the_notebook_reads_a_sweep_named_relative_to_the_repository(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    sweep = tmp_path / "sweep"
    _job(sweep / "0_seed-0", 1000)
    nb = nbformat.read(REPO_ROOT / "notebooks" / "onpolicy_vs_offpolicy.ipynb", as_version=4)
    nb.cells = nb.cells[:2]  # its set-up cell: which sweep, where the figures go
    relative = os.path.relpath(sweep, REPO_ROOT)  # ../../tmp/...: from notebooks/ it would name another folder
    monkeypatch.setenv("GRPOLAB_SWEEP_DIR", relative)  # the kernel inherits the environment
    monkeypatch.setenv("GRPOLAB_FIG_DIR", os.path.relpath(tmp_path / "figs", REPO_ROOT))
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(REPO_ROOT / "notebooks")}}).execute()
    out = "".join(o.get("text", "") for o in nb.cells[1].outputs if o.get("name") == "stdout")
    assert f"sweep: {sweep}\n" in out and f"figures: {tmp_path / 'figs'}\n" in out
    assert (tmp_path / "figs").is_dir()
