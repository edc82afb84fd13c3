"""Finding a sweep folder for ``notebooks/render.py`` and the notebook: a folder of job folders, e.g.
``multirun/compare/<time>`` (``-m ... task_name=compare``) or ``multirun/grid`` (``hydra.sweep.dir=multirun/grid``).

A job folder holds ``summary.json``; a sweep folder holds job folders. A path that is not absolute is read from the
current folder when it is there, else from the repository root (the notebook runs in ``notebooks/``).
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def resolve(path: str | os.PathLike, root: Path = ROOT) -> Path:
    """``path`` made absolute: as given when absolute, from the current folder when it exists there, else from
    ``root`` (the repository root)."""
    path = Path(path).expanduser()
    if path.is_absolute() or path.exists():
        return path.resolve()
    return (root / path).resolve()


def newest_sweep(multirun: Path) -> Path:
    """The sweep folder under ``multirun`` whose jobs wrote a ``summary.json`` last (a folder holding job folders,
    never a job folder itself).

    Raises:
        FileNotFoundError: naming ``multirun`` and what to pass instead, when no sweep there has a finished job.
    """
    newest: dict[Path, float] = {}
    for summary in multirun.rglob("summary.json"):
        sweep = summary.parent.parent  # <sweep>/<job>/summary.json
        if sweep != multirun and multirun not in sweep.parents:
            continue
        newest[sweep] = max(newest.get(sweep, 0.0), summary.stat().st_mtime)
    if not newest:
        raise FileNotFoundError(f"no sweep folder under {multirun} (a folder of job folders with summary.json, e.g. "
                                "multirun/compare/<time>); run a sweep (python src/train.py -m ...) or name its "
                                "folder: python notebooks/render.py <sweep> (the notebook: GRPOLAB_SWEEP_DIR=<sweep>)")
    return max(newest, key=newest.get)


def sweep_dir(path: str | os.PathLike | None, root: Path = ROOT) -> Path:
    """The sweep folder to read: ``path`` (:func:`resolve`), or with none the newest under ``<root>/multirun``."""
    return resolve(path, root) if path else newest_sweep(root / "multirun")
