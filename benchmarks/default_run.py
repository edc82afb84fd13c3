"""Time the default embedded runs end to end and report held-out accuracy before/after GRPO.

    python benchmarks/default_run.py                     # on-policy and off-policy, seed 0
    python benchmarks/default_run.py --algos grpo_onpolicy --extra trainer.max_steps=500

Each run is the real CLI (`python src/train.py algo=<algo> ...`) in its own folder under
benchmarks/results/<timestamp>/; the table printed at the end comes from each run's summary.json. The first
run includes the tiny model's warm start unless it is already cached (GRPOLAB_CACHE).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", default=["grpo_onpolicy", "grpo_offpolicy"])
    parser.add_argument("--extra", nargs="*", default=[], help="extra Hydra overrides for every run")
    args = parser.parse_args()
    out = ROOT / "benchmarks" / "results" / time.strftime("%Y-%m-%d_%H-%M-%S")
    rows = []
    for algo in args.algos:
        run_dir = out / algo
        start = time.perf_counter()
        cmd = [sys.executable, "src/train.py", f"algo={algo}", f"hydra.run.dir={run_dir}",
               "trainer.enable_progress_bar=false", *args.extra]
        subprocess.run(cmd, cwd=ROOT, check=True)
        wall = time.perf_counter() - start
        s = json.loads((run_dir / "summary.json").read_text())
        rows.append((algo, wall, s))
    print(f"\n{'algo':16s} {'wall s':>8s} {'train s':>8s} {'rollout s':>9s} {'refreshes':>9s} {'steps':>6s} "
          f"{'acc start':>9s} {'acc end':>8s} {'gain':>6s}")
    for algo, wall, s in rows:
        gain = s["val_accuracy_end"] - s["val_accuracy_start"]
        print(f"{algo:16s} {wall:8.1f} {s['time_train_s']:8.1f} {s['time_rollout_s']:9.1f} {s['sampler_refreshes']:9d} "
              f"{s['steps']:6d} {s['val_accuracy_start']:9.3f} {s['val_accuracy_end']:8.3f} {gain:+6.3f}")


if __name__ == "__main__":
    main()
