"""The owner of a run folder: the one object that decides a run's state, where it resumes, how its metrics stay
whole across resumes, and what a reader may take from it.

A run folder (a single run's ``hydra.run.dir``, or a multirun job's ``<sweep>/<num>_<overrides>``) holds
``summary.json``, ``metrics.csv``, ``checkpoints/last.ckpt``, ``.hydra/config.yaml``, ``error.txt`` (a multirun job
that raised), ``run_identity.json`` and ``.run.lock`` (:mod:`grpolab.app.run_identity`). :class:`RunFolder` is
what ``src/train.py`` (resume or skip, claim, stitch), the SLURM requeue (:mod:`grpolab.app.slurm`), the multirun
rerun (:mod:`grpolab.app.sweep_resume`), ``sweeps/sweep_status.py``, ``sweeps/report.py`` and
``sweeps/stale_rerun.py`` ask; none of them opens a run's files on its own. Files are written and read through
:mod:`grpolab.run_files` (atomic writes, tolerant reads).

- **State** (:meth:`RunFolder.state`, one of :data:`STATES`): ``finished`` only once every number the run owes is
  written (``trainer.max_steps`` steps, the last validation at the last step, the final eval's score when
  ``final_eval.enabled``: :func:`unfinished_reason`); ``interrupted`` (resumable from ``last.ckpt``); ``failed``;
  ``running or killed``; ``not started``. Whether it is running now is the lock's (:mod:`grpolab.app.run_identity`).
- **Resume in place** (:meth:`RunFolder.resume_in_place`): a multirun rerun and a SLURM requeue are two triggers of
  one resume: ``ckpt_path`` set to the folder's ``last.ckpt`` and ``metrics.csv``'s rows before it set aside
  (Lightning's CSV logger starts its file anew), put back in front when the run ends (:meth:`stitch_metrics`);
  any number of resumes and kills keeps every row. A manual resume (``ckpt_path=`` into a new folder) starts a new
  folder's file and needs neither.
"""

from __future__ import annotations

import contextlib
import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from grpolab.run_files import METRICS, SUMMARY, read_summary, write_csv, write_json

CONFIG = Path(".hydra") / "config.yaml"
BEFORE_RESUME = "metrics.before_resume.csv"  # the rows before the checkpoint while a resumed run runs
ERROR = "error.txt"  # a multirun job that raised: its traceback (src/train.py)
STATES = ("finished", "interrupted", "failed", "running or killed", "not started")


def _select(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(cfg, Mapping) or part not in cfg:
            return None
        cfg = cfg[part]
    return cfg


def max_steps_of(config: Mapping) -> int | None:
    """``trainer.max_steps`` of a composed config (a dict or a DictConfig); None when absent."""
    steps = _select(config, "trainer.max_steps")
    return steps if isinstance(steps, int) else None


def owed_numbers(config: Mapping) -> list[str]:
    """The summary keys a finished run owes beyond its training steps: the final eval's ``<split>_mean_at_<n>``
    when ``final_eval.enabled`` (``grpolab/evaluation/final.py`` names it)."""
    if not _select(config, "final_eval.enabled"):
        return []
    return [f"{_select(config, 'final_eval.split') or 'test'}_mean_at_{_select(config, 'final_eval.num_samples') or 16}"]


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool, not None, not NaN)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def unfinished_reason(summary: Mapping | None, max_steps: int | None, owed: Sequence[str] = ()) -> str | None:
    """None for a run that finished with every number it owes; else why not, in words.

    Args:
        summary: the run's ``summary.json`` (None: there is none).
        max_steps: ``trainer.max_steps`` (None or negative: any length counts).
        owed: summary keys that must hold a finite number (:func:`owed_numbers`).
    """
    if not summary:
        return "no summary.json (failed or still running)"
    steps = summary.get("steps")
    if summary.get("interrupted"):
        return f"interrupted at step {steps} (signal {summary.get('signal')})"
    if summary.get("failed"):
        failure = summary.get("failure") or {}
        return f"failed at step {failure.get('step', steps)}: {failure.get('reason', 'see summary.json')}"
    if isinstance(max_steps, int) and max_steps >= 0 and int(steps or 0) < max_steps:
        return f"stopped short, {steps} of {max_steps} steps"
    where = f" ({summary['stopped_in']} stopped by {summary.get('signal')})" if summary.get("stopped_in") else ""
    history = summary.get("val_history") or []
    last = history[-1].get("step") if history and isinstance(history[-1], Mapping) else None
    if "val_history" in summary and last != steps and (history or summary.get("stopped_in")):
        # val_accuracy_end would be an earlier step's number (a stop in the final validation)
        at = f"at step {last}" if history else "missing"
        return f"finished training but its last validation is {at}, not at its last step {steps}{where}"
    missing = [k for k in owed if not is_number(summary.get(k))]
    if missing:
        return f"finished training but has no number for {', '.join(missing)}{where}"
    return None


@dataclass(frozen=True)
class RunStatus:
    """What a run folder says about its result."""

    dir: Path
    summary: dict | None  # None: no summary.json, or one that cannot be read
    unfinished: str | None  # None: finished with every number it owes; else why not
    warning: str | None = None  # an unreadable summary.json: one line naming the file

    @property
    def finished(self) -> bool:
        return self.unfinished is None


class RunFolder:
    """One run's folder (see the module docstring); cheap to make, it reads nothing until asked.

    Args:
        path: the run folder (``paths.output_dir`` of the run's config: :meth:`of`).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @classmethod
    def of(cls, cfg: DictConfig) -> RunFolder:
        """The folder a composed config's run writes to (``paths.output_dir``)."""
        return cls(cfg.paths.output_dir)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    # ------------------------------------------------------------------------------------------------- reading
    @property
    def last_checkpoint(self) -> Path:
        """``checkpoints/last.ckpt``: where ``conf/callbacks/default.yaml`` and the signal handler save it."""
        return self.path / "checkpoints" / "last.ckpt"

    def config(self) -> dict:
        """The run's composed config, ``.hydra/config.yaml`` (``{}`` without one or when it cannot be read)."""
        import yaml

        try:
            return yaml.safe_load((self.path / CONFIG).read_text()) or {}
        except (OSError, yaml.YAMLError):
            return {}

    def summary(self) -> tuple[dict | None, str | None]:
        """``summary.json`` (:func:`grpolab.run_files.read_summary`): (dict, None), (None, None) without one, or
        (None, a line naming the file) when it cannot be read."""
        return read_summary(self.path)

    def status(self, config: Mapping | None = None) -> RunStatus:
        """Read ``summary.json`` and decide whether the run finished with every number it owes (``config``: its
        composed config; default ``.hydra/config.yaml``, which gives ``trainer.max_steps`` and the owed final-eval
        score). An unreadable summary is a run not finished, with :attr:`RunStatus.warning` set."""
        config = self.config() if config is None else config
        summary, problem = self.summary()
        if problem:
            return RunStatus(self.path, None, f"{problem}: read as not finished", f"{problem}: read as not finished")
        return RunStatus(self.path, summary, unfinished_reason(summary, max_steps_of(config), owed_numbers(config)))

    def state(self, status: RunStatus | None = None, max_steps: int | None = None) -> str:
        """One of :data:`STATES`: ``finished`` (:meth:`status`), ``interrupted`` (a summary marked so, or
        ``last.ckpt`` without a finished summary: a rerun resumes it), ``failed`` (``error.txt`` or a summary of
        a failed run, without a checkpoint), ``running or killed`` (started: a ``metrics.csv``, ``.hydra/`` or a
        summary that is not finished, nothing else) or ``not started``.

        Args:
            status: a :meth:`status` already read (default: read it now).
            max_steps: overrides the ``trainer.max_steps`` of ``.hydra/config.yaml`` (neither: the summary's word).
        """
        if status is None:
            config = self.config()
            if max_steps is not None:
                config = {**config, "trainer": {**(config.get("trainer") or {}), "max_steps": max_steps}}
            status = self.status(config)
        summary, has_ckpt = status.summary, self.last_checkpoint.exists()
        if status.finished:
            return "finished"
        if ((self.path / ERROR).exists() or bool(summary and summary.get("failed"))) and not has_ckpt:
            return "failed"
        if (summary and summary.get("interrupted")) or has_ckpt:
            return "interrupted"
        if summary is not None or status.warning or (self.path / METRICS).exists() or (self.path / ".hydra").is_dir():
            return "running or killed"
        return "not started"

    def train_tail_mean(self, column: str = "train/entropy", last: int = 10) -> float | None:
        """The mean of ``column`` of ``metrics.csv`` over its last ``last`` optimizer steps that log it (a train
        row's ``step`` is the optimizer step minus 1; a resumed run's file holds every row, the set-aside ones put
        back): e.g. the final entropy of the training completions. None without the file, the column or a finite
        value in it; a file that cannot be read is None too (a side number, never the reason a row is refused)."""
        try:
            with (self.path / METRICS).open(newline="", encoding="utf-8") as fh:
                reader = csv.DictReader(fh)
                if column not in (reader.fieldnames or []) or "step" not in (reader.fieldnames or []):
                    return None
                by_step: dict[int, float] = {}
                for row in reader:
                    try:
                        step, value = int(float(row["step"])), float(row[column])
                    except (TypeError, ValueError):
                        continue
                    if math.isfinite(value):
                        by_step[step] = value
        except (OSError, csv.Error, UnicodeDecodeError):
            return None
        if not by_step:
            return None
        tail = sorted(by_step)[-last:]
        return sum(by_step[s] for s in tail) / len(tail)

    def metrics(self):
        """``metrics.csv`` as a pandas DataFrame (None without the file)."""
        import pandas as pd

        path = self.path / METRICS
        return pd.read_csv(path) if path.exists() else None

    # ------------------------------------------------------------------------------------------------- writing
    def write_summary(self, summary: Mapping[str, Any]) -> None:
        """``summary.json``, atomically (a reader sees the old file or the new one)."""
        write_json(self.path / SUMMARY, dict(summary))

    def claim(self, cfg: DictConfig) -> contextlib.AbstractContextManager:
        """Hold the folder for the run of ``cfg`` (:func:`grpolab.app.run_identity.claim`: identity checked or
        recorded, ``.run.lock`` held; a run with other settings, or one running in another process, is refused in
        one line)."""
        from grpolab.app.run_identity import claim

        return claim(cfg)

    # ------------------------------------------------------------------------------------------------- resuming
    @staticmethod
    def checkpoint_step(ckpt: str | Path) -> int:
        """``global_step`` of a Lightning checkpoint (memory-mapped: the weights are not read)."""
        from grpolab.checkpoint.reading import load_checkpoint

        return int(load_checkpoint(str(ckpt)).get("global_step", 0))

    def resume_in_place(self, cfg: DictConfig, ckpt: Path | None = None) -> int:
        """Resume this folder's run from ``ckpt`` (default :attr:`last_checkpoint`), in place: ``cfg.ckpt_path``
        set to it, and ``metrics.csv``'s rows before its step set aside (:meth:`set_aside_metrics`). The one
        resume behind a multirun rerun and a SLURM requeue. Returns the checkpoint's step."""
        ckpt = self.last_checkpoint if ckpt is None else ckpt
        step = self.checkpoint_step(ckpt)
        with open_dict(cfg):
            cfg.ckpt_path = str(ckpt)
        self.set_aside_metrics(step)
        return step

    def owes_only_its_outputs(self, cfg: DictConfig, step: int) -> bool:
        """True when the checkpoint at ``step`` is at ``trainer.max_steps`` (stopped after its last step, before
        its summary and policy): the resume trains nothing and writes the outputs."""
        max_steps = OmegaConf.select(cfg, "trainer.max_steps")
        return isinstance(max_steps, int) and 0 <= max_steps <= step

    def set_aside_metrics(self, step: int) -> None:
        """Move the rows of ``metrics.csv`` logged before checkpoint step ``step`` to :data:`BEFORE_RESUME` (rows
        of steps after it, written after a periodic checkpoint and before a kill, are dropped: the resumed run
        logs them again). A validation row at ``step`` itself is kept (the checkpoint was saved after it).

        Rows set aside by an earlier resume that was killed before it could put them back (``kill -9``, a node
        lost) are put back first (:meth:`stitch_metrics`), so any number of resumes and kills keeps every row."""
        self.stitch_metrics()
        metrics = self.path / METRICS
        if not metrics.exists():
            return
        fields, rows = _read_rows(metrics)
        keep = [r for r in rows if _row_step(r) < step or (_row_step(r) == step and _is_validation(r))]
        write_csv(self.path / BEFORE_RESUME, fields, keep)
        metrics.unlink()

    def stitch_metrics(self) -> None:
        """Put the rows set aside by :meth:`set_aside_metrics` back in front of the resumed run's ``metrics.csv``
        (the union of both headers, in order) and remove :data:`BEFORE_RESUME`. Nothing when there is none."""
        before, metrics = self.path / BEFORE_RESUME, self.path / METRICS
        if not before.exists():
            return
        tables = [_read_rows(p) for p in (before, metrics) if p.exists()]
        fields = list(dict.fromkeys(f for names, _ in tables for f in names))
        write_csv(metrics, fields, [r for _, rows in tables for r in rows])
        before.unlink()


def _read_rows(path: Path) -> tuple[list[str], list[dict]]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def _row_step(row: dict) -> int:
    try:
        return int(float(row.get("step") or 0))
    except ValueError:
        return 0


def _is_validation(row: dict) -> bool:
    return any(k.startswith("val/") and v not in ("", None) for k, v in row.items())
