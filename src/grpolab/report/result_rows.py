"""Rows of a results table, one per run: the key that names a row, and a second row of a key refused by name.

A results CSV (``sweeps/sweep_status.py --csv``) and a report's jobs (``sweeps/report.py``, ``sweeps/stale_rerun.py``)
hold one row per key, e.g. (arm, seed, val_accuracy_start, the grid's other values): a statistic over seeds reads
each run once. Two rows of one key are never resolved by keeping the first or the last: they are refused with one
line naming the key and where each row is (:func:`duplicate_line`, :class:`DuplicateRows`).

:func:`cell` is how a key compares values: the text ``csv`` writes for a value of a summary and the text read back
from the file are the same cell (``0.0`` and ``"0.0"``, ``0`` and ``"0"``, None and ``""``), so a rerun of an export
finds the rows it wrote.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any


class DuplicateRows(ValueError):
    """Two or more rows of one key; the message names the key and the rows, on one line."""


def cell(value: Any) -> str:
    """The canonical text of one value of a row: ``""`` for None or an empty text; ``True``/``False`` for a bool; a
    number (or a text that reads as one) as Python writes the float (an integral one as an int: ``0``, ``0.0`` and
    ``"0"`` are one cell; ``nan`` and ``inf`` as such); any other text stripped."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    text = str(value).strip()
    if not text:
        return ""
    try:
        number = float(text)
    except ValueError:
        return text
    if math.isfinite(number) and number.is_integer():
        return str(int(number))
    return repr(number)


def row_key(row: Any, names: Sequence[str]) -> tuple[str, ...]:
    """The key of ``row`` (a mapping) over the columns ``names``, each value through :func:`cell`."""
    return tuple(cell(row.get(n)) for n in names)


def describe(names: Sequence[str], key: Sequence[Any]) -> str:
    """``(arm=onpolicy, seed=0)``: a key with its column names."""
    return "(" + ", ".join(f"{n}={v}" for n, v in zip(names, key)) + ")"


def duplicate_line(names: Sequence[str], key: Sequence[Any], places: Sequence[str]) -> str:
    """One line naming a duplicate key and where each of its rows is."""
    return f"duplicate {describe(names, key)}: {', '.join(places[:-1])} and {places[-1]}"


def duplicates(items: Iterable[tuple[tuple, str]]) -> dict[tuple, list[str]]:
    """``{key: [place, ...]}`` for every key that ``items`` (``(key, place)`` pairs, in order) holds more than once."""
    seen: dict[tuple, list[str]] = {}
    for key, place in items:
        seen.setdefault(key, []).append(place)
    return {k: places for k, places in seen.items() if len(places) > 1}


def refuse_duplicates(items: Iterable[tuple[tuple, str]], names: Sequence[str], hint: str = "") -> None:
    """Raise :class:`DuplicateRows` naming each key that ``items`` holds twice (one line: the keys joined by
    ``"; "``, then ``hint``); return when every key is there once."""
    found = duplicates(items)
    if found:
        raise DuplicateRows("; ".join(duplicate_line(names, k, p) for k, p in found.items()) + hint)
