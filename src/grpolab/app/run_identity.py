"""A multirun job folder's identity and owner: which settings trained what is in it, and which process is running
it now.

A job folder is found again by its name (``<num>_<overrides>``), and the name leaves keys out (``model.path``,
``data.path``: ``conf/hydra/default.yaml``). So at a job's first start :func:`claim` writes :data:`IDENTITY`: a
hash of every setting that decides what the run trains and scores (the composed config without
:data:`NOT_IDENTITY`, e.g. paths, loggers, progress bars, ``ckpt_path``), and the settings themselves. A later job
that lands in the same folder with other settings (a rerun with another ``model.path``, two sweeps whose jobs
differ only in a key left out of the name) is refused in one line naming the keys that differ, before it reads or
writes anything there: it never skips as finished, nor resumes from a checkpoint trained under other settings.

:func:`claim` also takes an exclusive lock (``flock``) on :data:`LOCK` for as long as the job runs: a second
process given the same job (two reruns of one sweep folder at once) is refused while the first lives; the
kernel drops the lock when the process ends, however it ends (``kill -9`` included), so a stale lock never blocks
a rerun.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from grpolab.errors import ConfigError
from grpolab.run_files import write_json

log = logging.getLogger("grpolab")

IDENTITY = "run_identity.json"
_HYDRA_RECORDS = ("config", "overrides")
LOCK = ".run.lock"
# top-level keys (or key prefixes) that do not change what a run trains or the numbers it reports
NOT_IDENTITY = ("paths", "logger", "callbacks", "tags", "task_name", "ckpt_path", "resume_drop_buffer",
                "torch_threads", "malloc_mmap_threshold", "save_policy", "plan", "finish_from_checkpoint",
                "trainer.enable_progress_bar", "trainer.enable_model_summary", "hydra")


class NotThisJob(ConfigError):
    """The job's folder belongs to another run: other settings, or a live process running it now. The job does
    not start; nothing in the folder is written (``src/train.py`` logs the line; no ``error.txt``)."""


class RunFolderBusy(NotThisJob):
    """The job's folder is locked by another live process (the same job running twice)."""


def settings(cfg: DictConfig) -> dict[str, Any]:
    """The settings that decide a run, flattened to ``{"a.b.c": value}`` (resolved; JSON values). Left out: the
    keys of :data:`NOT_IDENTITY` and every value made from a path or the environment (``${paths.*}``, Hydra's
    run and sweep folders, ``${oc.env:...}``: where a run writes and reads its cache, not what it trains). A value
    from Hydra's choices (``${tuned_lr[${hydra:runtime.choices.correction_arm}]}``) is kept, resolved."""
    where = ("${paths.", "${oc.env:", "${hydra:runtime.output_dir", "${hydra:run.", "${hydra:sweep.")
    keep = {}
    for key, raw in _flat(OmegaConf.to_container(cfg, resolve=False)).items():
        if _excluded(key) or any(w in str(raw) for w in where):
            continue
        try:
            value = OmegaConf.select(cfg, key, throw_on_missing=False)
            keep[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        except Exception:  # an interpolation that cannot be resolved here: its text decides
            keep[key] = raw
    return json.loads(json.dumps(keep, sort_keys=True, default=str))


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, Mapping) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: node}


def _excluded(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in NOT_IDENTITY)


def identity_hash(values: Mapping[str, Any]) -> str:
    """A short hash of :func:`settings`' values (16 hex digits of SHA-256 over their sorted JSON)."""
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


def differing_keys(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The keys of both :func:`settings` whose values differ, sorted. A key in one only is not a difference: a
    newer grpolab adds keys with their defaults (the record of a folder made before keeps what it had), and a
    value this module no longer records is left out on both sides. Nor is a grpolab class that moved to another
    module (:func:`same_setting`)."""
    return sorted(k for k in set(recorded) & set(now) if not same_setting(k, recorded[k], now[k]))


def same_setting(key: str, recorded: Any, now: Any) -> bool:
    """Whether a recorded value is the present one. A ``_target_`` (a key, or one inside a value, e.g.
    ``trainer.plugins``' checkpoint plugin) naming a grpolab class by a module path that no longer exists is the
    same as the present target of that class name: the class moved (a folder recorded before a restructure of
    grpolab resumes), it did not change."""
    if isinstance(recorded, Mapping) and isinstance(now, Mapping):
        return recorded.keys() == now.keys() and all(same_setting(k, recorded[k], now[k]) for k in recorded)
    if isinstance(recorded, list) and isinstance(now, list):
        return len(recorded) == len(now) and all(same_setting(key, a, b) for a, b in zip(recorded, now))
    if recorded == now:
        return True
    return (key.rpartition(".")[2] == "_target_" and isinstance(recorded, str) and isinstance(now, str)
            and recorded.startswith("grpolab.") and now.startswith("grpolab.")
            and recorded.rpartition(".")[2] == now.rpartition(".")[2] and not _module_exists(recorded))


def _module_exists(target: str) -> bool:
    """Whether the module of a dotted ``_target_`` (``a.b.Class`` -> ``a.b``) can be found."""
    try:
        return importlib.util.find_spec(target.rpartition(".")[0]) is not None
    except (ImportError, ValueError):  # a parent that is not a package (a module moved into one's place)
        return False


def check_identity(out: Path, values: Mapping[str, Any]) -> None:
    """Write :data:`IDENTITY` in ``out`` when there is none; else refuse other settings.

    Hydra has rewritten ``.hydra/config.yaml`` and ``overrides.yaml`` for this job before it starts; the copies
    taken at the first start (``*.at_start.yaml``) are put back on a refusal, so the record names what trained.

    Raises:
        NotThisJob: naming the folder and up to 6 keys that differ, with their recorded and present values.
    """
    path, hydra = out / IDENTITY, out / ".hydra"
    try:
        recorded = json.loads(path.read_text())
    except FileNotFoundError:
        for name in _HYDRA_RECORDS:
            if (hydra / f"{name}.yaml").is_file():
                shutil.copyfile(hydra / f"{name}.yaml", hydra / f"{name}.at_start.yaml")
        write_json(path, {"hash": identity_hash(values), "settings": dict(values)})
        return
    except (OSError, ValueError):
        recorded = {}
    if not isinstance(recorded, dict) or recorded.get("hash") == identity_hash(values):
        return
    before = recorded.get("settings") or {}
    keys = differing_keys(before, values)
    if not keys:  # the same settings; the record has fewer or more keys (another grpolab version)
        return
    shown = ", ".join(f"{k}={before[k]} there, {values[k]} now" for k in keys[:6])
    more = f" and {len(keys) - 6} more" if len(keys) > 6 else ""
    for name in _HYDRA_RECORDS:
        if (hydra / f"{name}.at_start.yaml").is_file():
            shutil.copyfile(hydra / f"{name}.at_start.yaml", hydra / f"{name}.yaml")
    raise NotThisJob(f"{out}: this job folder holds a run with other settings ({shown}{more}); it is not the same "
                      "job. Use another hydra.sweep.dir, or rerun with the settings it was trained with")


@contextlib.contextmanager
def claim(cfg: DictConfig) -> Iterator[None]:
    """Around a multirun job: hold :data:`LOCK` in its folder (``cfg.paths.output_dir``), take over the folder the
    same job had under another number (:func:`adopt_renumbered`) and check its identity (:func:`check_identity`).

    Raises:
        RunFolderBusy: another live process holds the folder's lock.
        NotThisJob: the folder holds a run with other settings.
    """
    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    fd = _lock(out)
    try:
        values = settings(cfg)
        adopt_renumbered(out, values)
        check_identity(out, values)
        yield
    finally:
        os.close(fd)  # releases the lock


def _lock(folder: Path) -> int:
    """An open descriptor of ``folder``'s :data:`LOCK`, exclusively locked, with this pid in it.

    Raises:
        RunFolderBusy: another live process holds it.
    """
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RunFolderBusy(f"{folder}: this job is running in another process (pid {owner}); not started twice. "
                            "Wait for it, or stop it and rerun") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def adopt_renumbered(out: Path, values: Mapping[str, Any]) -> Path | None:
    """A grid extended after it ran (``seed=0`` -> ``seed=0,1``) gives its jobs new numbers, so a job's folder
    ``<num>_<overrides>`` changes its number. When ``out`` is new (no :data:`IDENTITY`) and a sibling folder
    ``<other num>_<same overrides>`` holds this job (the same settings by :data:`IDENTITY`), its files move into
    ``out`` (Hydra's ``.hydra/`` of this launch kept; the sibling's log as ``train.before_renumber.log``) and the
    sibling goes: the job is then skipped as finished or resumed, never trained again from scratch.

    Returns:
        The sibling taken over, or None.

    Raises:
        RunFolderBusy: the sibling is locked by a live process.
    """
    if (out / IDENTITY).exists() or "_" not in out.name:
        return None
    suffix = out.name.split("_", 1)[1]
    for sibling in sorted(out.parent.glob(f"*_{suffix}")):
        if sibling == out or not sibling.is_dir() or not sibling.name.split("_", 1)[0].isdigit():
            continue
        try:
            recorded = json.loads((sibling / IDENTITY).read_text())
        except (OSError, ValueError):
            continue
        theirs = recorded.get("settings") if isinstance(recorded, dict) else None
        if not theirs or not set(theirs) & set(values) or differing_keys(theirs, values):
            continue
        fd = _lock(sibling)
        try:
            for kept in (sibling / ".hydra").glob("*.at_start.yaml"):  # what it was first trained with
                (out / ".hydra").mkdir(exist_ok=True)
                kept.replace(out / ".hydra" / kept.name)
            for entry in sibling.iterdir():
                if entry.name in (".hydra", LOCK):
                    continue
                target = out / ("train.before_renumber.log" if entry.name == "train.log" else entry.name)
                if target.exists():
                    shutil.rmtree(target) if target.is_dir() else target.unlink()
                entry.replace(target)
        finally:
            os.close(fd)
        shutil.rmtree(sibling)
        log.warning("sweep job %s: the grid's jobs were renumbered (extended?); took over %s, the same job (same "
                    "settings)", out.name, sibling.name)
        return sibling
    return None
