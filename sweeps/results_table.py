"""The markdown table of a results CSV (``sweep_status.py --csv``): one row per arm, best first.

    python sweeps/results_table.py sweeps/results/corrections_small_default.csv --start 0.297 --vs onpolicy
    python sweeps/results_table.py sweeps/results/async_default.csv sweeps/results/corrections_confirm_default.csv

Each row: the arm, its seeds, the final test mean@16 per seed (in seed order), the mean over seeds and its
standard error (sample standard deviation / sqrt(n); "-" for one seed). ``--vs ARM`` adds the difference of the
means to that arm with the standard error of the difference (sqrt(se_a^2 + se_b^2)). A CSV holds rows from
several machines, told apart by ``val_accuracy_start`` (another machine computes another warm start):
``--start`` keeps the rows whose value rounds to it (3 decimals); without it every machine's rows are pooled and
the table says so. Several CSVs are read as one (a grid whose arms were run by two sweeps with the same settings).

The difference's standard error here is unpaired. For the paired difference on the seeds both arms ran, a bootstrap
interval, the paired t-test, TOST and warnings where arms differ, use ``python sweeps/report.py <csv> --vs ARM``.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections import defaultdict


def summarize(rows: list[dict], metric: str = "test_mean_at_16") -> dict[str, dict]:
    """Per arm: ``seeds`` (sorted; a seed run on two machines appears twice), ``values`` (in seed order), ``mean``
    and ``se`` (None for one run).

    Raises:
        ValueError: naming the CSV row (1-based, after the header) whose ``metric`` is not a number.
    """
    by_arm: dict[str, list[tuple[int, float]]] = defaultdict(list)  # a seed run on two machines counts twice
    for i, row in enumerate(rows, start=1):
        try:
            by_arm[row["arm"]].append((int(row["seed"]), float(row[metric])))
        except (KeyError, ValueError) as err:
            raise ValueError(f"row {i} ({row.get('arm')}, seed {row.get('seed')}): {metric} is not a number") from err
    out = {}
    for arm, runs in by_arm.items():
        runs.sort(key=lambda r: r[0])
        seeds, values = [r[0] for r in runs], [r[1] for r in runs]
        se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None
        out[arm] = {"seeds": seeds, "values": values, "mean": statistics.fmean(values), "se": se}
    return out


def markdown(stats: dict[str, dict], vs: str | None = None) -> str:
    """The table, arms by mean (best first)."""
    head = "| arm | seeds | per seed | test mean@16 | SE (seeds) |" + (f" vs `{vs}` |" if vs else "")
    lines = [head, "|---" * (6 if vs else 5) + "|"]
    for arm, s in sorted(stats.items(), key=lambda kv: -kv[1]["mean"]):
        se = "-" if s["se"] is None else f"{s['se']:.3f}"
        line = (f"| `{arm}` | {', '.join(map(str, s['seeds']))} | {' / '.join(f'{v:.3f}' for v in s['values'])} "
                f"| {s['mean']:.3f} | {se} |")
        if vs:
            ref = stats.get(vs)
            if ref is None or arm == vs:
                line += " - |"
            else:
                both = [x for x in (s["se"], ref["se"]) if x is not None]
                diff_se = f" +- {math.sqrt(sum(x * x for x in both)):.3f}" if len(both) == 2 else ""
                line += f" {s['mean'] - ref['mean']:+.3f}{diff_se} |"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("csv", nargs="+")
    p.add_argument("--start", type=float, help="keep the rows of this val_accuracy_start (one machine's warm start)")
    p.add_argument("--vs", help="an arm to compare every other arm with")
    p.add_argument("--metric", default="test_mean_at_16")
    args = p.parse_args(argv)
    rows = []
    for path in args.csv:
        with open(path) as fh:
            rows += list(csv.DictReader(fh))
    starts = sorted({round(float(r["val_accuracy_start"]), 3) for r in rows})
    if args.start is not None:
        rows = [r for r in rows if round(float(r["val_accuracy_start"]), 3) == round(args.start, 3)]
        if not rows:
            sys.exit(f"results_table.py: error: no row has val_accuracy_start {args.start}; the CSV has {starts}")
    elif len(starts) > 1:
        print(f"(rows of {len(starts)} warm starts pooled: val_accuracy_start {starts}; --start keeps one)")
    print(markdown(summarize(rows, args.metric), args.vs))
    if args.vs:
        print(f"(SE = standard error over seeds; the difference's SE is unpaired: sweeps/report.py --vs {args.vs} pairs "
              "seeds and tests it)")


if __name__ == "__main__":
    main()
