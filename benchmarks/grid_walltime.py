"""Wall time of a whole Hydra multirun grid: one job after another (Hydra's basic launcher) against N jobs at once
(``hydra/launcher=joblib``), in one invocation (docs/guide/evaluation-and-sweeps.md, "Every core"; the measured
ratio: docs/results/performance.md).

    python benchmarks/grid_walltime.py                    # 6 jobs (algo x 3 seeds) of 300 steps, 2 jobs at once
    python benchmarks/grid_walltime.py --steps 20 --seeds 0,1 --n-jobs 2   # a quick check that it works

Each arm is one ``python src/train.py -m algo=grpo_onpolicy,grpo_offpolicy seed=<seeds> trainer.max_steps=<steps>``
into its own sweep folder (default tiny model and task, ``torch_threads=auto``: one thread per job; no policy
export); the second adds ``hydra/launcher=joblib hydra.launcher.n_jobs=<n>``. A one-step run first fills the
warm-start cache, so neither arm pays for it. Prints each arm's wall time, every job's ``time_total_s``, the ratio
(target with 2 jobs on 2 cores: 1.7x or more) and the load average before and after: measure on
an otherwise idle machine. The numbers are also written to ``benchmarks/results/grid_walltime_<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["trainer.enable_progress_bar=false", "save_policy=false", "final_eval.enabled=false"]


def grid(sweep: Path, steps: int, seeds: str, launcher: list[str]) -> tuple[float, list[float]]:
    """Run the grid into ``sweep``; returns its wall time (s) and every job's ``time_total_s``."""
    cmd = [sys.executable, str(ROOT / "src" / "train.py"), "-m", *COMMON, "algo=grpo_onpolicy,grpo_offpolicy",
           f"seed={seeds}", f"trainer.max_steps={steps}", f"hydra.sweep.dir={sweep}", *launcher]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    jobs = [json.loads(p.read_text())["time_total_s"] for p in sorted(sweep.glob("*/summary.json"))]
    expected = 2 * len(seeds.split(","))
    if len(jobs) != expected:
        raise SystemExit(f"{sweep}: {len(jobs)} of {expected} jobs wrote summary.json")
    return wall, jobs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", default="0,1,2", help="comma list; the grid is 2 algos x these seeds")
    parser.add_argument("--n-jobs", type=int, default=2, help="jobs at once in the joblib arm")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="grid_walltime_") as tmp:
        warm = [sys.executable, str(ROOT / "src" / "train.py"), *COMMON, "trainer.max_steps=1", "val.at_start=false",
                f"hydra.run.dir={tmp}/warm"]
        subprocess.run(warm, cwd=ROOT, check=True, capture_output=True)
        load0 = os.getloadavg()
        basic, basic_jobs = grid(Path(tmp) / "basic", args.steps, args.seeds, [])
        joblib, joblib_jobs = grid(Path(tmp) / "joblib", args.steps, args.seeds,
                                   ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={args.n_jobs}"])
        load1 = os.getloadavg()
    n = len(basic_jobs)
    print(f"grid: {n} jobs x {args.steps} steps on {os.cpu_count()} cores")
    print(f"basic launcher (one at a time): {basic:7.1f} s  jobs {[round(t, 1) for t in basic_jobs]}")
    print(f"joblib, {args.n_jobs} at once:        {joblib:7.1f} s  jobs {[round(t, 1) for t in joblib_jobs]}")
    print(f"speed-up: {basic / joblib:.2f}x (target 1.7x with 2 jobs on 2 cores)")
    print(f"load average (1/5/15 min) before {load0[0]:.1f}/{load0[1]:.1f}/{load0[2]:.1f}, "
          f"after {load1[0]:.1f}/{load1[1]:.1f}/{load1[2]:.1f}")
    out = ROOT / "benchmarks" / "results" / f"grid_walltime_{time.strftime('%Y%m%d_%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"steps": args.steps, "seeds": args.seeds, "n_jobs": args.n_jobs, "cores": os.cpu_count(),
                               "basic_s": basic, "joblib_s": joblib, "speedup": basic / joblib,
                               "basic_jobs_s": basic_jobs, "joblib_jobs_s": joblib_jobs,
                               "loadavg_before": load0, "loadavg_after": load1}, indent=1))
    print(f"written: {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
