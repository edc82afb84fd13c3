"""A run folder's files, written and read in one place: every reader asks these functions instead of opening a
run's files on its own.

- **Writing** (:func:`write_json`, :func:`write_text`, :func:`write_csv`, :func:`replacing`): to a temporary file
  in the same folder, flushed and fsync'ed, then ``os.replace`` onto the name. A reader (a report, the status of a
  sweep, the next try of a job) sees the old file or the new one, never half of one; a writer that fails or is
  killed leaves the old file (and at most a ``.<name>.<pid>.tmp`` beside it).
- **Reading** (:func:`read_json`, :func:`read_summary`): a file that is not valid JSON (written by an older
  version without the rename and killed while writing it) is None with one line naming the file, never an
  exception.
- **Deciding** (:func:`unfinished_reason`, :func:`run_status`): whether a run finished with every number it owes
  (not interrupted, not failed, ``trainer.max_steps`` steps, and the final eval's ``<split>_mean_at_<n>`` when
  ``final_eval.enabled``), and if not, why, in words.

``grpolab/app/sweep_resume.py`` (skip or resume a multirun job), ``sweeps/sweep_status.py`` (the state of each job and
the results rows), ``sweeps/report.py`` and ``src/eval.py`` (the run an evaluated policy comes from) read runs
through it; ``grpolab/app/run.py`` writes ``summary.json`` and ``final_eval.json`` through it.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

SUMMARY = "summary.json"
CONFIG = Path(".hydra") / "config.yaml"


@contextmanager
def replacing(path: str | Path, mode: str = "w", newline: str | None = None) -> Iterator[IO]:
    """Open a temporary file beside ``path`` for writing; on a clean exit flush, fsync and ``os.replace`` it onto
    ``path`` (then fsync the folder, where the platform allows); on an exception remove it and leave ``path`` as it
    was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, mode, newline=newline, **({} if "b" in mode else {"encoding": "utf-8"})) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # the rename itself survives a power cut once the folder's entry is on disk
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (:func:`replacing`)."""
    with replacing(path) as fh:
        fh.write(text)


def write_json(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (:func:`replacing`): an object json cannot write raises and
    leaves the old file."""
    with replacing(path) as fh:
        json.dump(obj, fh, indent=indent)


def write_csv(path: str | Path, fields: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> None:
    """Write a header ``fields`` and ``rows`` (keys not in ``fields`` ignored) to ``path`` atomically."""
    with replacing(path, newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(fields), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def read_json(path: str | Path) -> tuple[Any, str | None]:
    """``(the parsed JSON, None)``; ``(None, None)`` when there is no such file; ``(None, one line naming the file
    and why)`` when it cannot be read or is not valid JSON."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, None
    except OSError as err:
        return None, f"{path}: cannot be read ({err.strerror or err})"
    try:
        return json.loads(text), None
    except ValueError as err:
        return None, f"{path}: not valid JSON ({err}; half-written?)"


def read_summary(run_dir: str | Path) -> tuple[dict | None, str | None]:
    """The run's ``summary.json`` as a dict and None; ``(None, None)`` without one; ``(None, a line naming the
    file)`` when it is unreadable, not JSON or not a JSON object."""
    summary, problem = read_json(Path(run_dir) / SUMMARY)
    if summary is not None and not isinstance(summary, dict):
        return None, f"{Path(run_dir) / SUMMARY}: not a JSON object"
    return summary, problem


METRICS = "metrics.csv"


def train_tail_mean(run_dir: str | Path, column: str = "train/entropy", last: int = 10) -> float | None:
    """The mean of ``column`` of the run's ``metrics.csv`` over its last ``last`` optimizer steps that log it (a
    train row's ``step`` is the optimizer step minus 1; a resumed run's file holds every row, the set-aside ones
    put back): e.g. the final entropy of the training completions. None without the file, the column or a finite
    value in it; a file that cannot be read is None too (it is a side number, never the reason a row is refused)."""
    path = Path(run_dir) / METRICS
    try:
        with path.open(newline="", encoding="utf-8") as fh:
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


def read_config(run_dir: str | Path) -> dict:
    """The run's composed config, ``.hydra/config.yaml`` (``{}`` without one or when it cannot be read)."""
    import yaml

    try:
        return yaml.safe_load((Path(run_dir) / CONFIG).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}


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


def run_status(run_dir: str | Path, config: Mapping | None = None) -> RunStatus:
    """Read ``run_dir``'s ``summary.json`` and decide whether the run finished with every number it owes
    (``config``: its composed config; default ``.hydra/config.yaml``, which gives ``trainer.max_steps`` and the
    owed final-eval score). An unreadable summary is a run not finished, with :attr:`RunStatus.warning` set."""
    run_dir = Path(run_dir)
    config = read_config(run_dir) if config is None else config
    summary, problem = read_summary(run_dir)
    if problem:
        return RunStatus(run_dir, None, f"{problem}: read as not finished", f"{problem}: read as not finished")
    return RunStatus(run_dir, summary, unfinished_reason(summary, max_steps_of(config), owed_numbers(config)))
