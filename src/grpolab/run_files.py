"""A run folder's files, written and read atomically: the input and output under :class:`grpolab.app.run_folder.RunFolder`,
which decides what they mean (state, resume, metrics continuity), and under the few writers below the application
(the evaluation's ``eval.json``, the W&B run id).

- **Writing** (:func:`write_json`, :func:`write_text`, :func:`write_csv`, :func:`replacing`): to a temporary file
  in the same folder, flushed and fsync'ed, then ``os.replace`` onto the name. A reader (a report, the status of a
  sweep, the next try of a job) sees the old file or the new one, never half of one; a writer that fails or is
  killed leaves the old file (and at most a ``.<name>.<pid>.tmp`` beside it).
- **Reading** (:func:`read_json`, :func:`read_summary`): a file that is not valid JSON (written by an older
  version without the rename and killed while writing it) is None with one line naming the file, never an
  exception.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

SUMMARY = "summary.json"
METRICS = "metrics.csv"


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
