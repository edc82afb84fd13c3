"""The exit cost that ``grpolab.app.cli.skip_the_exit_collection`` removes, measured side by side.

    python benchmarks/exit_collection.py [--rounds 3]

Each round starts two processes one after the other that import what ``src/train.py`` imports (torch, transformers,
Lightning, the grpolab application) and exit: one plain, one with ``skip_the_exit_collection()`` registered first.
It prints each process's CPU seconds (user + system, from ``os.wait4``) and the ratio of the medians. Run it on an
otherwise idle machine (two busy processes on 2 cores slow each other).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
CHILD = """
import sys
sys.path.insert(0, {src!r})
if {skip}:
    from grpolab.app.cli import skip_the_exit_collection
    skip_the_exit_collection()
import torch, transformers, lightning.pytorch  # noqa: E401  what a training process holds
import grpolab.app.run  # noqa: F401
"""


def cpu_seconds(skip: bool) -> float:
    """CPU seconds of one child process that imports the stack and exits."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD.format(src=str(SRC), skip=skip)])
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        sys.exit(f"the child exited with status {status}")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    plain, skipped = [], []
    for _ in range(args.rounds):
        plain.append(cpu_seconds(False))
        skipped.append(cpu_seconds(True))
    print("plain exit      CPU s:", " ".join(f"{x:.2f}" for x in plain))
    print("skipped walk    CPU s:", " ".join(f"{x:.2f}" for x in skipped))
    a, b = statistics.median(plain), statistics.median(skipped)
    print(f"median {a:.2f} -> {b:.2f} s: {b / a:.2f}x the CPU, {a - b:.2f} s less per process")


if __name__ == "__main__":
    main()
