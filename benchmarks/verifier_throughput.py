"""How many completions per second each verifier scores on this machine, in and out of worker processes.

Real data from ../shared/data (never copied into the repo):

- ``math``: MATH-500, 1000 completions: the 500 reference solutions (full worked solutions ending in a
  boxed answer) and 500 short "The final answer is $\\boxed{<gold>}$." completions, scored against the
  500 gold answers.
- ``gsm8k``: the 1319 GSM8K test solutions (calculator annotations stripped, ending in ``#### N``).
- ``exact``: the 1319 GSM8K test golds as completions (string comparison).
- ``format``: the 1000 math completions wrapped in ``<think>...</think><answer>...</answer>``.

Modes (``Verifier`` settings): ``batch`` (``timeout_s=None, num_workers=0``: one call per function over the
whole batch), ``thread`` (``timeout_s=10, num_workers=0``: per-completion calls under the watchdog thread),
and ``workers=N`` (``timeout_s=10, num_workers=N``). Each mode is timed on a cold first call (worker
start-up and empty caches included) and then on ``--repeats`` warm calls (best of them reported, since
a gold is scored G times per group during training, the gold-parse cache is warm then too).

Usage: ``python benchmarks/verifier_throughput.py [--workers 2] [--repeats 2] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from grpolab.tasks.gsm8k import gsm8k_gold
from grpolab.tasks.loading import strip_calculator_annotations
from grpolab.verifiers.exact import ExactMatchVerifier
from grpolab.verifiers.format import FormatVerifier
from grpolab.verifiers.gsm8k import GSM8KVerifier
from grpolab.verifiers.math import MathVerifier
from grpolab.verifiers.reward import Verifier

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def workloads() -> dict[str, tuple[object, list[str], list[str]]]:
    """Verifier, completions and golds per benchmark."""
    math_rows = _jsonl(DATA / "math500" / "test.jsonl")
    math_golds = [r["answer"] for r in math_rows] * 2
    math_completions = [r["solution"] for r in math_rows] + [
        f"The final answer is $\\boxed{{{r['answer']}}}$." for r in math_rows
    ]
    gsm_rows = _jsonl(DATA / "gsm8k" / "test.jsonl")
    gsm_golds = [gsm8k_gold(r["answer"]) for r in gsm_rows]
    gsm_completions = [strip_calculator_annotations(r["answer"]) for r in gsm_rows]
    tagged = [f"<think>\n{c}\n</think>\n<answer>\n{c[-40:]}\n</answer>" for c in math_completions]
    return {
        "math": (MathVerifier(), math_completions, math_golds),
        "gsm8k": (GSM8KVerifier(), gsm_completions, gsm_golds),
        "exact": (ExactMatchVerifier(), list(gsm_golds), gsm_golds),
        "format": (FormatVerifier(), tagged, math_golds),
    }


def run(
    name: str, verifier: object, completions: list[str], golds: list[str], timeout_s, num_workers, repeats
):
    rm = Verifier({name: verifier}, timeout_s=timeout_s, num_workers=num_workers)
    try:
        start = time.perf_counter()
        out = rm(completions, answer=golds)
        cold = time.perf_counter() - start
        warm = []
        for _ in range(repeats):
            start = time.perf_counter()
            out = rm(completions, answer=golds)
            warm.append(time.perf_counter() - start)
    finally:
        rm.close()
    n = len(completions)
    scored = [r for r in out.rewards if r is not None]
    return {
        "n": n,
        "cold_per_s": n / cold,
        "warm_per_s": n / min(warm) if warm else None,
        "mean_reward": sum(scored) / max(1, len(scored)),
        "timeouts": out.num_timeouts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2], help="worker-process counts to time")
    parser.add_argument("--repeats", type=int, default=2, help="warm repetitions per mode (best is reported)")
    parser.add_argument("--only", nargs="+", default=None, help="verifiers to time (default: all)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()

    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    if hasattr(os, "getloadavg"):
        print("# load average before: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    modes = [("batch", None, 0), ("thread", 10.0, 0)] + [(f"workers={w}", 10.0, w) for w in args.workers]
    results = []
    header = f"{'verifier':8} {'mode':10} {'n':>5} {'cold/s':>9} {'warm/s':>9} {'mean':>6} {'timeouts':>8}"
    print(header)
    print("-" * len(header))
    for name, (verifier, completions, golds) in workloads().items():
        if args.only and name not in args.only:
            continue
        for mode, timeout_s, num_workers in modes:
            r = run(name, verifier, completions, golds, timeout_s, num_workers, args.repeats)
            r.update(verifier=name, mode=mode)
            results.append(r)
            print(
                f"{name:8} {mode:10} {r['n']:5d} {r['cold_per_s']:9.1f} {r['warm_per_s']:9.1f} "
                f"{r['mean_reward']:6.3f} {r['timeouts']:8d}",
                flush=True,
            )
    if hasattr(os, "getloadavg"):
        print("# load average after: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
