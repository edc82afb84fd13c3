"""Record, or check against a recording, the metrics.csv of the six reference runs.

A refactor that keeps the test suite green can still change the maths. This script runs the same six seeded
60-step trainings before and after a change and compares their ``metrics.csv`` column by column, ignoring the
columns that are timings (a ``time`` path part, ``*time*``, ``*per_s*`` such as ``tokens_per_second``):

    python benchmarks/metrics_parity.py record /tmp/parity-before     # on the old commit
    python benchmarks/metrics_parity.py check  /tmp/parity-before     # on the new one: exit 1 on any difference
    python benchmarks/metrics_parity.py check  /tmp/parity-before --new-column train/lower_bound/kl_step  # a column
                                                                          # added on purpose is not compared

Each run is ``python src/train.py trainer.max_steps=60`` plus one of the overrides in ``RUNS``. Runs go one
at a time (two busy processes on a 2-core machine slow each other down, though the bits do not depend on it).
"""

from __future__ import annotations

import argparse
import csv
import math
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS: dict[str, list[str]] = {
    "onpolicy": [],
    "offpolicy": ["algo=grpo_offpolicy"],
    "offpolicy_async": ["algo=grpo_offpolicy", "rollout.async_generation=true"],
    "reuse": ["algo=grpo_reuse"],
    "adaptive": ["algo=grpo_offpolicy", "rollout.refresh=adaptive", "rollout.max_drift=0.05"],
    "hf_copy": ["algo=grpo_offpolicy", "rollout=hf_copy"],
}
COMMON = ["trainer.max_steps=60"]


def is_timing(column: str) -> bool:
    """True for columns whose values are wall-clock measurements rather than maths."""
    parts = column.lower().split("/")
    return "time" in parts or any("time" in p or "per_s" in p for p in parts)


def run(name: str, out_dir: Path) -> Path:
    """Run one reference training into ``out_dir/name`` and return its metrics.csv path."""
    run_dir = out_dir / name
    cmd = [sys.executable, str(ROOT / "src" / "train.py"), *COMMON, *RUNS[name], f"hydra.run.dir={run_dir}",
           "save_policy=false"]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    return run_dir / "metrics.csv"


def read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def compare(before: Path, after: Path, new_columns: tuple[str, ...] = ()) -> list[str]:
    """Differences between two metrics.csv files, timing columns excluded (empty list: identical). ``new_columns``:
    columns the new commit adds on purpose (a new diagnostic); every other column must be in both."""
    cols_a, rows_a = read(before)
    cols_b, rows_b = read(after)
    problems = []
    keep_a = {c for c in cols_a if not is_timing(c)}
    keep_b = {c for c in cols_b if not is_timing(c) and c not in new_columns}
    if keep_a != keep_b:
        problems.append(f"columns differ: only before {sorted(keep_a - keep_b)}, only after {sorted(keep_b - keep_a)}")
    if len(rows_a) != len(rows_b):
        problems.append(f"row count {len(rows_a)} != {len(rows_b)}")
    for i, (ra, rb) in enumerate(zip(rows_a, rows_b)):
        for c in sorted(keep_a & keep_b):
            va, vb = ra.get(c, ""), rb.get(c, "")
            if va == vb:
                continue
            try:
                if math.isnan(float(va)) and math.isnan(float(vb)):
                    continue
            except ValueError:
                pass
            problems.append(f"row {i} column {c}: {va!r} != {vb!r}")
            if len(problems) > 20:
                return problems
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["record", "check"])
    parser.add_argument("recording", type=Path, help="folder holding <run>/metrics.csv of the old commit")
    parser.add_argument("--runs", nargs="*", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--new-column", action="append", default=[], metavar="NAME",
                        help="a column the new commit adds on purpose (check: not compared; repeatable)")
    args = parser.parse_args()
    if args.mode == "record":
        for name in args.runs:
            run(name, args.recording)
        return 0
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.runs:
            problems = compare(args.recording / name / "metrics.csv", run(name, Path(tmp)), tuple(args.new_column))
            print(f"{name}: {'identical' if not problems else 'DIFFERENT'}")
            for p in problems:
                print("   ", p)
            failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
