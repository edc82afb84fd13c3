"""torch_threads=1 against torch's default on the tiny model, alternated in one invocation (its figures:
docs/results/performance.md).

    python benchmarks/threads.py                 # 2 repeats of 40 steps per arm
    python benchmarks/threads.py --repeats 3 --steps 80

Each run is ``python src/train.py model.warmstart=null trainer.max_steps=<steps>`` (no validation, no policy
export) with ``torch_threads=1`` or ``torch_threads=null``, one at a time, alternating, so both arms see the
same load. Prints steps per training second of every run, the per-arm means and their ratio, and the load
average before and after. Start a busy process beside it (e.g. ``python -c "while True: pass"``) to measure a
loaded machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = {"1": "torch_threads=1", "default": "torch_threads=null"}


def run(arm: str, steps: int, out: Path) -> float:
    """Steps per training second of one run."""
    cmd = [sys.executable, str(ROOT / "src" / "train.py"), "model.warmstart=null", f"trainer.max_steps={steps}",
           "trainer.val_check_interval=100000", "val.at_start=false", "final_eval.enabled=false", "save_policy=false",
           "trainer.enable_progress_bar=false", ARMS[arm], f"hydra.run.dir={out}"]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    summary = json.loads((out / "summary.json").read_text())
    return summary["steps"] / summary["time_train_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    print("load average before:", os.getloadavg())
    rates: dict[str, list[float]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for arm in ARMS:
                rate = run(arm, args.steps, Path(tmp) / f"{arm}_{rep}")
                rates[arm].append(rate)
                print(f"repeat {rep} torch_threads={arm}: {rate:.2f} steps/s", flush=True)
    means = {arm: sum(v) / len(v) for arm, v in rates.items()}
    print("load average after:", os.getloadavg())
    print(f"mean steps/s: one thread {means['1']:.2f}, default {means['default']:.2f}; "
          f"one thread / default = {means['1'] / means['default']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
