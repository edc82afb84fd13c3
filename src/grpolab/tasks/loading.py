"""Reading task data: local JSONL / JSON / parquet files, or a Hugging Face hub dataset.

Local files are read without ``datasets`` (plain :mod:`json`, :mod:`pyarrow` for parquet) so errors can
name the file, the row and the line, and so a test run does not pay ``datasets``' import and cache. Hub
datasets go through ``datasets.load_dataset`` (imported only then).

Every error says which file (or hub id), which row (0-based; for JSONL also the 1-based line) and which
key is at fault, before any training starts.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from grpolab.errors import ConfigError, ConfigPathError

Record = dict[str, Any]

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")
# Column names a row cannot carry under their own name: the Task's own keys, and the names the trainer
# passes to reward functions next to the dataset columns.
RESERVED_COLUMNS = ("uid", "prompt", "answer", "completions", "prompts", "completion_ids", "truncated")
_ANNOTATION_RE = re.compile(r"<<[^<>]*>>")


def strip_calculator_annotations(text: str) -> str:
    """Remove GSM8K calculator annotations: ``"48/2 = <<48/2=24>>24"`` -> ``"48/2 = 24"``.

    Examples:
        >>> strip_calculator_annotations("She makes 9 * 2 = $<<9*2=18>>18 every day.")
        'She makes 9 * 2 = $18 every day.'
    """
    return _ANNOTATION_RE.sub("", text)


def read_local(path: str | Path) -> list[Record]:
    """Read every record of a local ``.jsonl``, ``.json`` (a list of objects, or ``{"data": [...]}``)
    or ``.parquet`` file.

    Args:
        path: the file.

    Returns:
        The records, in file order (blank JSONL lines are skipped).

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: on an unsupported suffix, a line that is not a JSON object (names file and line), or
            a file with no rows.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigPathError(
            f"data file not found: {path} (data.path is resolved from the working directory)"
        )
    suffix = path.suffix.lower()
    if suffix not in LOCAL_SUFFIXES:
        raise ConfigError(f"{path}: unsupported file type {suffix!r}; use one of {LOCAL_SUFFIXES}")
    records: list[Record] = []
    if suffix == ".jsonl":
        with path.open("rb") as f:
            for lineno, raw in enumerate(f, start=1):
                line = _decode_line(raw, path, lineno)
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ConfigError(
                        f"{path}: line {lineno} (row {len(records)}) is not valid JSON: {e}"
                    ) from e
                if not isinstance(obj, dict):
                    raise ConfigError(
                        f"{path}: line {lineno} (row {len(records)}) is a {type(obj).__name__}, not a JSON object"
                    )
                records.append(obj)
    elif suffix == ".json":
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            lineno = data.count(b"\n", 0, e.start) + 1
            _decode_line(data.splitlines()[lineno - 1], path, lineno)
            raise  # pragma: no cover - _decode_line raises for the same bytes
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON: {e}") from e
        if isinstance(obj, dict) and isinstance(obj.get("data"), list):
            obj = obj["data"]
        if not isinstance(obj, list):
            raise ConfigError(
                f"{path}: expected a list of objects (or {{'data': [...]}}), got {type(obj).__name__}"
            )
        for i, rec in enumerate(obj):
            if not isinstance(rec, dict):
                raise ConfigError(f"{path}: row {i} is a {type(rec).__name__}, not an object")
        records = obj
    else:
        import pyarrow.parquet as pq

        records = pq.read_table(path).to_pylist()
    if not records:
        raise ConfigError(f"{path}: the file has no rows")
    return records


def _decode_line(raw: bytes, path: Path, lineno: int) -> str:
    """One line of a data file as text; a line that is not UTF-8 is an error naming the file and line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        snippet = raw[max(0, e.start - 20) : e.start + 20]
        raise ConfigError(
            f"{path}: line {lineno} is not valid UTF-8 (byte {e.start + 1} of the line, near {snippet!r}); "
            "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face hub endpoint (``HF_ENDPOINT``) accepts a TCP connection within ``timeout_s``
    seconds; False at once when ``HF_HUB_OFFLINE`` is set. Without this probe, ``datasets`` retries an unreachable
    hub for about 30 s before failing."""
    import socket
    from urllib.parse import urlparse

    import huggingface_hub.constants as hub

    if hub.HF_HUB_OFFLINE:
        return False
    url = urlparse(hub.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=timeout_s).close()
    except OSError:
        return False
    return True


@contextmanager
def _offline():
    """``datasets`` and ``huggingface_hub`` in offline mode (the local cache only) for the duration."""
    import datasets.config
    import huggingface_hub.constants as hub

    saved = datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = saved


def load_hub(hub_id: str, config: str | None, split: str) -> list[Record]:
    """Load one split of a Hugging Face hub dataset with ``datasets.load_dataset``.

    When the hub cannot be reached (:func:`hub_reachable`), only the local ``datasets`` cache is tried, so a
    machine without a network fails in seconds, not after ``datasets``' retries.

    Raises:
        ConfigError: the hub cannot be reached and the split is not cached (one line naming ``data.hub_id`` and the
            local-file keys ``data.path`` / ``data.test_path``), or the split has no rows.
        RuntimeError: when ``datasets`` fails otherwise (unknown id, config or split); the message names the id,
            config and split, and the original error is chained.
    """
    import datasets

    online = hub_reachable()
    try:
        with nullcontext() if online else _offline():
            ds = datasets.load_dataset(hub_id, config, split=split)
    except Exception as e:
        if not online:
            raise ConfigError(
                f"data.hub_id={hub_id!r} (config {config!r}, split {split!r}): the hub cannot be reached and the "
                "split is not in the local datasets cache; set data.path (and data.test_path) to local "
                ".jsonl/.json/.parquet files with the task's columns"
            ) from e
        raise RuntimeError(
            f"could not load hub dataset {hub_id!r} (config {config!r}, split {split!r}): {e}"
        ) from e
    records = ds.to_list()
    if not records:
        raise ConfigError(f"hub dataset {hub_id!r} (config {config!r}, split {split!r}) has no rows")
    return records


def load_records(
    path: str | Path | None, hub_id: str | None = None, config: str | None = None, split: str = "train"
) -> tuple[list[Record], str]:
    """Records from ``path`` when given, else from the hub.

    Returns:
        The records and a name for messages (the file path, or ``hub_id[config]:split``).

    Raises:
        ValueError: if neither ``path`` nor ``hub_id`` is given; see :func:`read_local` and
            :func:`load_hub` for the rest.
    """
    if path:
        return read_local(path), str(path)
    if not hub_id:
        raise ConfigError("give data.path (a local .jsonl/.json/.parquet file) or data.hub_id")
    source = f"{hub_id}" + (f"[{config}]" if config else "") + f":{split}"
    return load_hub(hub_id, config, split), source


def check_keys(records: list[Record], keys: Iterable[str], source: str) -> None:
    """Check that every record has every key with a non-empty value.

    A key missing from the first record is taken as misspelt and the error lists the available columns
    (with a close match if any); a key missing further down names the row.

    Raises:
        ValueError: naming ``source``, the row and the key.
    """
    keys = list(keys)
    if not records:
        raise ConfigError(f"{source}: no rows")
    columns = sorted(records[0])
    for key in keys:
        if key not in records[0]:
            close = difflib.get_close_matches(key, columns, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{source}: no column {key!r}; available columns: {columns}{hint}")
    for i, rec in enumerate(records):
        for key in keys:
            if key not in rec:
                raise ConfigError(f"{source}: row {i} has no {key!r} column (columns: {sorted(rec)})")
            value = rec[key]
            if value is None or (isinstance(value, str) and not value.strip()):
                raise ConfigError(f"{source}: row {i} has an empty {key!r}")


def extra_columns(record: Record, used: Iterable[str], reserved: Iterable[str] = ()) -> Record:
    """The columns of ``record`` not in ``used``; a column whose name is in ``reserved`` (a name the
    trainer or the verifiers already use, e.g. ``completions``) is kept as ``source_<name>``."""
    used, reserved = set(used), set(reserved)
    out: Record = {}
    for k, v in record.items():
        if k in used:
            continue
        out[f"source_{k}" if k in reserved else k] = v
    return out
