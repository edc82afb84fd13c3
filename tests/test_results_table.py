"""sweeps/results_table.py: the results pages' tables from a results CSV (mean and standard error over seeds)."""

from __future__ import annotations

import csv
import importlib.util
import math

import pytest
from conftest import REPO_ROOT

spec = importlib.util.spec_from_file_location("results_table", REPO_ROOT / "sweeps" / "results_table.py")
results_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(results_table)

FIELDS = ["arm", "seed", "test_mean_at_16", "val_accuracy_start"]


def _write(path, rows):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(dict(zip(FIELDS, r, strict=True)) for r in rows)
    return path


def test_mean_se_and_difference_by_hand(tmp_path, capsys):
    rows = [("a", 1, 0.5, 0.297), ("a", 0, 0.3, 0.297), ("b", 0, 0.2, 0.297), ("b", 1, 0.2, 0.297),
            ("b", 2, 0.5, 0.297), ("a", 0, 0.9, 0.316)]  # another machine's warm start: dropped by --start
    a, b = _write(tmp_path / "a.csv", rows[:2]), _write(tmp_path / "b.csv", rows[2:])  # two sweeps' files, one table
    results_table.main([str(a), str(b), "--start", "0.297", "--vs", "b"])
    out = capsys.readouterr().out.splitlines()
    se_a = math.sqrt(((0.3 - 0.4) ** 2 + (0.5 - 0.4) ** 2) / 1) / math.sqrt(2)  # 0.0707
    se_b = math.sqrt(((0.2 - 0.3) ** 2 * 2 + (0.5 - 0.3) ** 2) / 2) / math.sqrt(3)  # 0.1
    assert out[2] == f"| `a` | 0, 1 | 0.300 / 0.500 | 0.400 | {se_a:.3f} | +0.100 +- {math.hypot(se_a, se_b):.3f} |"
    assert out[3] == f"| `b` | 0, 1, 2 | 0.200 / 0.200 / 0.500 | 0.300 | {se_b:.3f} | - |"


def test_pooled_machines_are_named_and_a_bad_row_is_named(tmp_path, capsys):
    path = _write(tmp_path / "r.csv", [("a", 0, 0.3, 0.297), ("a", 1, 0.4, 0.316)])
    results_table.main([str(path)])
    out = capsys.readouterr().out
    assert "2 warm starts pooled" in out and "| `a` | 0, 1 | 0.300 / 0.400 | 0.350 |" in out  # both machines' rows
    results_table.main([str(_write(tmp_path / "twice.csv", [("a", 0, 0.3, 0.297), ("a", 0, 0.5, 0.316)]))])
    assert "| `a` | 0, 0 | 0.300 / 0.500 | 0.400 |" in capsys.readouterr().out  # one seed on two machines: kept twice
    with pytest.raises(SystemExit, match=r"no row has val_accuracy_start 0.5; the CSV has \[0.297, 0.316\]"):
        results_table.main([str(path), "--start", "0.5"])
    with pytest.raises(ValueError, match=r"row 2 \(a, seed 1\): test_mean_at_16 is not a number"):
        results_table.main([str(_write(tmp_path / "bad.csv", [("a", 0, 0.3, 0.297), ("a", 1, "", 0.297)]))])
