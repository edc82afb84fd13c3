"""A statistics report over sweep folders: per arm mean and SE over seeds, paired differences to a baseline.

    python sweeps/report.py multirun/<name>/<time> [more sweep folders or results CSVs] --vs algo=grpo_onpolicy
    python sweeps/report.py $S --vs onpolicy --margin 0.02 --curves-out sweeps/results/<name>_curves.csv
    python sweeps/report.py sweeps/results/async_default.csv --vs onpolicy --start 0.297   # the checked-in rows
    python sweeps/report.py sweeps/results/<name>_curves.csv --out /tmp/figs                # figures only

Inputs are sweep folders (every job below them: ``summary.json``, ``metrics.csv``, ``.hydra/overrides.yaml`` and
``config.yaml``), results CSVs (one row per job: ``arm``, ``seed``, the metric; ``sweep_status.py --csv``) and
curve CSVs (``--curves-out``; they draw the figures without the runs). An arm is named by the overrides the user
typed that differ between jobs, less the seed keys (``--seed-key``, default ``seed``) and ``hydra.*``/``paths.*``
(e.g. ``algo=grpo_async``): any grid works, not only ``sweeps/*.yaml``. Jobs are matched by seed.

Per arm: the metric's mean and standard error over seeds (SE = sample sd / sqrt(n)); against ``--vs``: the paired
difference on the seeds both arms ran, with its SE, a 95% interval (the t interval below 10 pairs, the percentile
bootstrap from 10; none for one pair or a difference that is the same on every seed, said in words) and the
two-sided paired t-test's p (scipy), and with ``--margin m`` the TOST equivalence p for "within +-m"
(``grpolab/report/stats.py``). A warnings column says where an arm differs from the baseline in seeds, warm start
(``val_accuracy_start``), steps, test split or generated samples. The metric is chosen once (``--metric``, or the
final test score ``test_mean_at_<n>``); a job without it is left out, with a warning naming it. Jobs that failed,
were interrupted, stopped short of ``trainer.max_steps``, lack the final eval's score they owe or whose
``summary.json`` cannot be read are left out, with a warning (``grpolab/app/run_folder.py`` decides). Two jobs or rows
of one (arm, seed) are refused, naming both.

Writes ``report.md`` (printed too), ``report.csv``, ``curves.png`` (held-out accuracy and train reward against steps
and wall-clock, mean +- SE band over seeds per arm) and ``differences.png`` into ``--out`` (default
``<sweep folder>/report``, or ``multirun/report/<csv name>`` for a CSV).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # `python sweeps/report.py` without install

from grpolab.app.run_folder import RunFolder  # noqa: E402
from grpolab.report import stats  # noqa: E402
from grpolab.report.result_rows import DuplicateRows, describe, duplicates  # noqa: E402
from grpolab.run_files import read_json, replacing, write_csv, write_text  # noqa: E402

IGNORED_PREFIXES = ("hydra.", "paths.")
CURVE_COLUMNS = {  # compact curve file column -> metrics.csv column (a mean over the steps since the last row)
    "train_reward": "train/reward", "grad_norm": "train/grad_norm", "entropy": "train/entropy",
    "clip_frac": "train/clip_ratio/region_mean", "kl_sampler_policy": "train/kl_sampler_policy",
    "kl_step": "train/lower_bound/kl_step",  # KL between consecutive policies (grad_norm: before clipping)
    "ratio_mean": "train/ratio/mean", "ratio_max": "train/ratio/max",
}


@dataclass
class Job:
    """One run: where it came from, the overrides the user typed (key -> value), its summary and seed."""

    source: str
    overrides: dict[str, str]
    summary: dict
    seed: tuple = ()
    arm: str = ""
    config: dict = field(default_factory=dict)
    test_split: str = ""


def _override_pairs(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines or []:
        if "=" in str(line):
            key, value = str(line).split("=", 1)
            out[key.lstrip("+~")] = value
    return out


def _get(cfg: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(cfg, dict) or part not in cfg:
            return None
        cfg = cfg[part]
    return cfg


def read_sweep(folder: Path) -> tuple[list[Job], list[str]]:
    """Every job folder under ``folder`` (one with ``summary.json`` or ``.hydra/overrides.yaml``).

    Returns:
        (the jobs that finished with every number they owe, :meth:`RunFolder.status`; one warning per
        job left out: no summary.json, one that cannot be read, interrupted, failed, fewer steps than its
        ``trainer.max_steps``, or no final-eval score where ``final_eval.enabled``).
    """
    dirs = {p.parent for p in folder.rglob("summary.json")} | {p.parent.parent for p in folder.rglob(".hydra/overrides.yaml")}
    jobs, warnings = [], []
    for job_dir in sorted(dirs):
        hydra = job_dir / ".hydra"
        overrides = _override_pairs(yaml.safe_load((hydra / "overrides.yaml").read_text())
                                    if (hydra / "overrides.yaml").exists() else [])
        folder = RunFolder(job_dir)
        config = folder.config()
        status = folder.status(config)
        if not status.finished:
            warnings.append(f"left out {job_dir}: {status.unfinished}")
            continue
        summary = status.summary
        job = Job(source=str(job_dir), overrides=overrides, summary=summary, config=config)
        final, problem = read_json(job_dir / "final_eval.json")
        if problem:
            warnings.append(f"{problem}: the test split is named from summary.json")
        per_prompt = final.get("per_prompt") if isinstance(final, dict) else None
        if per_prompt:  # the test split itself: the ids of its prompts
            job.test_split = "prompts " + hashlib.sha1("\n".join(sorted(per_prompt)).encode()).hexdigest()[:8]
        elif summary.get("data"):
            job.test_split = f"{summary['data']} seed {summary.get('data_seed')}, {summary.get('test_num_prompts')} prompts"
        jobs.append(job)
    return jobs, warnings


def read_results_csv(path: Path) -> list[Job]:
    """The rows of a results CSV (``arm``, ``seed``, metric columns) as jobs named ``arm=<arm>``. A column named
    by a dotted config key (``algo.learning_rate``, ``model.warmstart.seed``: ``sweep_status.py --csv`` writes one
    per key its grid varies) is an override of the row's job, so it names arms or, with ``--seed-key``, pairs."""
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    jobs = []
    for i, row in enumerate(rows, start=1):
        absent = [c for c in ("arm", "seed") if c not in row]
        if absent:
            raise ValueError(f"{path}: row {i} has no {' or '.join(repr(c) for c in absent)} column; a results CSV "
                             f"needs 'arm' and 'seed' (its columns: {', '.join(k for k in row if k)})")
        summary = {k: _number(v) for k, v in row.items() if k != "arm"}
        dotted = {k: v for k, v in row.items() if k and "." in k and v not in (None, "")}
        parts = row["arm"].split(",")
        # sweep_status.py's arm of a grid it was not told: every override but the seed (algo=a,trainer.max_steps=40):
        # its overrides, so the arms are named by those that vary, as the sweep folder's report names them
        arm = dict(q.split("=", 1) for q in parts) if all("=" in q for q in parts) else {"arm": row["arm"]}
        jobs.append(Job(source=f"{path}:{i}", overrides={**arm, **dotted, "seed": row["seed"]},
                        summary=summary, test_split=""))
    return jobs


def _number(value):
    if value in (None, ""):
        return None
    try:
        number = float(value)
    except ValueError:
        return value
    return int(number) if number.is_integer() and "." not in str(value) else number


def name_arms(jobs: list[Job], seed_keys: list[str]) -> list[str]:
    """Name each job's arm (in place) by the overrides that differ between jobs, less seeds and hydra/paths keys;
    return those keys, in the order the user typed them."""
    keys: list[str] = []
    for job in jobs:
        keys += [k for k in job.overrides if k not in keys]
    keys = [k for k in keys if k not in seed_keys and not k.startswith(IGNORED_PREFIXES)]
    varying = [k for k in keys if len({job.overrides.get(k) for job in jobs}) > 1]
    for job in jobs:
        job.arm = " ".join(f"{k}={job.overrides[k]}" for k in varying if k in job.overrides) or "all jobs"
        job.seed = tuple(str(job.overrides.get(k, job.summary.get(k, ""))) for k in seed_keys)
    return varying


def _matching(value: str, arms: list[str]) -> list[str]:
    """The arms ``value`` names: exactly, or as one of their ``key=value`` parts, or as a value."""
    if value in arms:
        return [value]
    return [a for a in arms if value in a.split(" ") or value in [p.split("=", 1)[-1] for p in a.split(" ")]]


def select_arms(values: list[str], arms: list[str]) -> set[str]:
    """The arms ``--arm`` keeps: every arm each value names (a value may name several, e.g. ``onpolicy`` with its
    lrs).

    Raises:
        ValueError: naming the value and the arms, for a value that names none.
    """
    keep = set()
    for value in values:
        found = _matching(value, arms)
        if not found:
            raise ValueError(f"--arm {value!r} matches no arm; the arms are: " + "; ".join(arms))
        keep.update(found)
    return keep


def resolve_arm(vs: str, arms: list[str]) -> str:
    """The arm ``--vs`` names: an arm's exact name, or one of its ``key=value`` parts, or a value.

    Raises:
        ValueError: naming ``--vs`` and the arms, if none or several match.
    """
    found = _matching(vs, arms)
    if len(found) != 1:
        hint = ""
        if len(found) > 1:  # one arm split by a key that varies like a seed (e.g. model.warmstart.seed)?
            parts = [dict(q.split("=", 1) for q in a.split(" ") if "=" in q) for a in found]
            keys = sorted({k for d in parts for k in d if len({d.get(k) for d in parts}) > 1})
            hint = ("; if they are one arm over " + ", ".join(keys) + ", pair on it: --seed-key seed "
                    + " ".join(f"--seed-key {k}" for k in keys))
        raise ValueError(f"--vs {vs!r} matches {len(found)} arms ({', '.join(found) or 'none'}); the arms are: "
                         + "; ".join(arms) + hint)
    return found[0]


def default_metric(jobs: list[Job]) -> str:
    """The metric when ``--metric`` is not given, chosen once for the whole report: the final test score
    ``test_mean_at_<n>`` that the most jobs hold (a tie: the first seen), else ``val_accuracy_end``. A job without
    it is left out with a warning (:func:`build_table`); the metric never changes because one job lacks it."""
    counts: dict[str, int] = {}
    for job in jobs:
        for key, value in job.summary.items():
            if re.fullmatch(r"test_mean_at_\d+", key) and isinstance(value, (int, float)):
                counts[key] = counts.get(key, 0) + 1
    return max(counts, key=counts.get) if counts else "val_accuracy_end"


def refuse_duplicate_jobs(jobs: list[Job], seed_keys: list[str]) -> None:
    """Raise :class:`~grpolab.report.result_rows.DuplicateRows` when two jobs are one (arm, seed): one line naming the key
    and both rows (a statistic over seeds reads each run once; neither is kept)."""
    found = duplicates(((j.arm, *j.seed), j.source) for j in jobs)
    if not found:
        return
    lines = [f"duplicate {describe(['arm', *seed_keys], (f'`{k[0]}`', *k[1:]))}: "
             + f"{', '.join(places[:-1])} and {places[-1]}" for k, places in found.items()]
    starts = sorted({f"{float(j.summary['val_accuracy_start']):.3f}" for j in jobs
                     if isinstance(j.summary.get("val_accuracy_start"), (int, float))})
    hint = ("; each (arm, seed) is one run: remove one, or pair on another key with --seed-key" if len(starts) < 2 else
            f"; the rows come from {len(starts)} warm starts (val_accuracy_start {', '.join(starts)}): --start keeps "
            "one; --seed-key seed --seed-key val_accuracy_start pairs within each")
    raise DuplicateRows("; ".join(lines) + hint)


def _natural(text: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text))


def _fmt_set(values) -> str:
    values = sorted({str(v) for v in values}, key=_natural)
    return ", ".join(values) if len(values) <= 6 else f"{', '.join(values[:3])}, ... ({len(values)})"


def _traits(jobs: list[Job], metric: str) -> dict[str, set]:
    def start(j):
        v = j.summary.get("val_accuracy_start")
        return "?" if v is None else f"{float(v):.3f}"

    def samples(j):
        m = re.search(r"_at_(\d+)$", metric)
        per_step = j.summary.get("completions")
        steps = j.summary.get("steps")
        train = f"{per_step / steps:g} completions/step" if per_step and steps else "?"
        return f"{train}, eval n={m.group(1) if m else _get(j.config, 'final_eval.num_samples') or '?'}"

    return {"seeds": {"/".join(j.seed) for j in jobs}, "warm starts": {start(j) for j in jobs},
            "steps": {str(j.summary.get("steps", "?")) for j in jobs}, "test splits": {j.test_split or "?" for j in jobs},
            "generated samples": {samples(j) for j in jobs}}


def arm_warnings(arm_jobs: list[Job], base_jobs: list[Job] | None, metric: str) -> list[str]:
    """Where an arm differs from the baseline (or within itself: several warm starts, steps, ...)."""
    mine = _traits(arm_jobs, metric)
    theirs = _traits(base_jobs, metric) if base_jobs else None
    out = []
    for name, values in mine.items():
        if theirs is not None and values != theirs[name] and not (values | theirs[name]) <= {"?"}:
            out.append(f"{name} differ: {_fmt_set(values)} vs baseline {_fmt_set(theirs[name])}")
        elif name != "seeds" and len(values) > 1:
            out.append(f"{name} differ between seeds: {_fmt_set(values)}")
    return out


def build_table(jobs: list[Job], metric: str, vs: str | None, margin: float | None,
                warnings: list[str]) -> list[dict]:
    """One row per arm (baseline first, then by mean, best first): the numbers of the markdown table and CSV.
    A job without a number for ``metric`` is left out with a warning naming it.

    Raises:
        DuplicateRows: two jobs of one (arm, seed) (:func:`refuse_duplicate_jobs`).
    """
    refuse_duplicate_jobs(jobs, [])
    by_arm: dict[str, dict[tuple, Job]] = {}
    for job in jobs:
        value = job.summary.get(metric)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            warnings.append(f"left out {job.source}: no number for {metric} in its summary")
            continue
        by_arm.setdefault(job.arm, {})[job.seed] = job
    base = by_arm.get(vs) if vs else None
    rows = []
    for arm, runs in by_arm.items():
        values = {s: float(j.summary[metric]) for s, j in runs.items()}
        mean, se = stats.mean_se(list(values.values()))
        row = {"arm": arm, "n": len(values), "seeds": _fmt_set("/".join(s) for s in values), "mean": mean, "se": se,
               "diff": None, "diff_se": None, "ci_low": None, "ci_high": None, "ci_method": None, "p_paired_t": None,
               "tost_p": None, "n_paired": None, "note": None, "values": values}
        if base is not None and arm != vs:
            base_values = {s: float(j.summary[metric]) for s, j in base.items()}
            try:
                paired = stats.compare(values, base_values, margin=margin)
            except ValueError:
                paired = None
            if paired is not None:
                row.update(diff=paired.diff, diff_se=paired.se, ci_method=paired.ci_method, p_paired_t=paired.p,
                           tost_p=paired.tost_p, n_paired=len(paired.seeds), note=paired.note)
                if paired.ci is not None:
                    row.update(ci_low=paired.ci[0], ci_high=paired.ci[1])
        found = arm_warnings(list(runs.values()), list(base.values()) if base and arm != vs else None, metric)
        row["warnings"] = "; ".join([*([row["note"]] if row["note"] else []), *found])
        rows.append(row)
    rows.sort(key=lambda r: (r["arm"] != vs, -r["mean"]))
    return rows


def _f(x, spec=".3f", missing="-") -> str:
    return missing if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _no_interval(r: dict) -> str:
    """The words for a paired row without an interval or test."""
    return "none: 1 pair" if r["n_paired"] == 1 else "none: zero variance"


def markdown(rows: list[dict], metric: str, vs: str | None, margin: float | None) -> str:
    """The table with its legend (SE, the test, the interval, TOST)."""
    head = ["arm", "seeds", "n", f"{metric} mean +- SE"]
    if vs:
        head += [f"paired diff vs `{vs}` +- SE", "95% CI", "p (paired t)"]
        if margin is not None:
            head.append(f"TOST p (+-{margin:g})")
    head.append("warnings")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"`{r['arm']}`", r["seeds"], str(r["n"]), f"{r['mean']:.3f} +- {_f(r['se'])}"]
        if vs:
            if r["diff"] is None:
                cells += ["baseline" if r["arm"] == vs else "no common seed", "-", "-"]
            elif r["ci_method"] is None:  # one pair, or zero variance: said, not a number from rounding
                paired = " (n=1)" if r["n_paired"] == 1 else f" +- {_f(r['diff_se'])}"
                if r["n_paired"] not in (1, r["n"]):
                    paired += f" (n={r['n_paired']})"
                cells += [f"{r['diff']:+.3f}{paired}", _no_interval(r), _no_interval(r)]
            else:
                paired = f" (n={r['n_paired']})" if r["n_paired"] != r["n"] else ""
                cells += [f"{r['diff']:+.3f} +- {_f(r['diff_se'])}{paired}",
                          f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] ({r['ci_method']})", _f(r["p_paired_t"])]
            if margin is not None:
                cells.append(_no_interval(r) if r["diff"] is not None and r["ci_method"] is None else _f(r["tost_p"]))
        cells.append(r["warnings"] or "")
        lines.append("| " + " | ".join(cells) + " |")
    legend = [f"Metric `{metric}`; mean +- SE over seeds (SE = sample standard deviation / sqrt(n), not the sd)."]
    if vs:
        legend.append(f"Paired diff: arm minus baseline on the seeds both ran (n= when fewer than the arm's), mean "
                      f"+- SE of the per-seed differences; 95% CI of that mean: below {stats.BOOTSTRAP_MIN_N} pairs the "
                      "t interval (t: scipy.stats.t.interval, df n-1; it excludes 0 exactly when p < 0.05), from "
                      f"{stats.BOOTSTRAP_MIN_N} pairs the percentile bootstrap (bootstrap: 10000 resamples); none "
                      "for one pair or a difference that is the same on every seed (zero variance); p: two-sided "
                      "paired t-test (scipy.stats.ttest_rel), not corrected for the number of arms.")
        if margin is not None:
            legend.append(f"TOST p: two one-sided t-tests that the paired difference lies within +-{margin:g}; "
                          "p < 0.05 = equivalent at the 5% level.")
    return "\n".join(lines) + "\n\n" + "\n".join(legend)


CSV_FIELDS = ["arm", "n", "seeds", "mean", "se", "diff", "diff_se", "ci_low", "ci_high", "ci_method", "p_paired_t",
              "tost_p", "n_paired", "note", "warnings"]


def job_curves(job: Job, every: int) -> list[dict]:
    """The compact curve of one sweep job: a row at every ``every``-th optimizer step, at each validation and at
    the last step; ``val_accuracy`` where validated, train columns averaged over the steps since the last row,
    ``time_s`` the elapsed training time (0 at step 0)."""
    import pandas as pd

    m = RunFolder(job.source).metrics()
    train = pd.DataFrame()
    if m is not None:
        if "train/reward" in m:
            train = m[m["train/reward"].notna()].copy()
            train["opt_step"] = train["step"] + 1
    val = {int(v["step"]): v.get("accuracy") for v in job.summary.get("val_history") or []}
    last = int(train["opt_step"].max()) if len(train) else max(val, default=0)
    steps = sorted({s for s in range(every, last + 1, every)} | set(val) | {last})
    rows, prev = [], 0
    for step in steps:
        window = train[(train["opt_step"] > prev) & (train["opt_step"] <= step)] if len(train) else train
        at = train[train["opt_step"] == step] if len(train) else train
        time_s = 0.0 if step == 0 else (float(at["train/time/elapsed"].iloc[0]) if len(at) and
                                         "train/time/elapsed" in at else None)
        row = {"arm": job.arm, "seed": "/".join(job.seed), "step": step, "time_s": time_s, "val_accuracy": val.get(step)}
        for name, column in CURVE_COLUMNS.items():
            row[name] = float(window[column].mean()) if len(window) and column in window and window[column].notna().any() else None
        rows.append(row)
        prev = max(prev, step)
    return rows


def plot_curves(curves, out: Path, vs: str | None) -> Path:
    """``curves.png``: held-out accuracy and train reward against steps and wall-clock, per arm the mean over
    seeds with a band of +- one SE (where two or more seeds have the point)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5), sharey="row")
    arms = sorted(curves["arm"].unique(), key=lambda a: (a != vs, a))
    for j, arm in enumerate(arms):
        color = plt.get_cmap("tab10" if len(arms) <= 10 else "tab20")(j % 20)
        for row, col in enumerate(["val_accuracy", "train_reward"]):
            d = curves[(curves["arm"] == arm) & curves[col].notna()]
            if not len(d):
                continue
            g = d.groupby("step")
            mean, n = g[col].mean(), g[col].count()
            se = (g[col].std(ddof=1) / np.sqrt(n)).where(n > 1)
            t = g["time_s"].mean()
            for c, x in enumerate([mean.index.to_numpy(float), t.to_numpy(float)]):
                ax = axes[row, c]
                ax.plot(x, mean, color=color, lw=1.6, label=f"{arm} ({d['seed'].nunique()} runs)",
                        marker="o" if len(mean) < 12 else None, ms=3)
                ax.fill_between(x, mean - se, mean + se, color=color, alpha=0.2, lw=0)
    for c, xlabel in enumerate(["optimizer steps", "wall-clock (s of training, mean over runs)"]):
        axes[1, c].set_xlabel(xlabel)
    axes[0, 0].set_ylabel("held-out accuracy (val, mean@n)")
    axes[1, 0].set_ylabel("train reward (mean since the last point)")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    axes[0, 0].set_title("band: mean +- SE over runs")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    path = out / "curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_differences(rows: list[dict], out: Path, metric: str, vs: str) -> Path:
    """``differences.png``: each arm's paired difference to the baseline with its 95% interval (t below
    ``stats.BOOTSTRAP_MIN_N`` pairs, bootstrap from there, named beside the arm); an arm without one (one pair,
    zero variance) is a point, marked so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["diff"] is not None]
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.5))
    labels = []
    for i, r in enumerate(rows):
        if r["ci_method"] is None:
            ax.plot(r["diff"], i, "o", color="k", mfc="white")
            labels.append(f"{r['arm']} ({_no_interval(r).split(': ')[1]})")
        else:
            ax.errorbar(r["diff"], i, xerr=[[r["diff"] - r["ci_low"]], [r["ci_high"] - r["diff"]]], fmt="o", color="k")
            labels.append(f"{r['arm']} ({r['ci_method']}, n={r['n_paired']})")
    ax.axvline(0, color="gray", lw=1)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.set_xlabel(f"{metric}: paired difference to {vs} (95% CI: t below {stats.BOOTSTRAP_MIN_N} pairs, else bootstrap)")
    fig.tight_layout()
    path = out / "differences.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("inputs", nargs="+", type=Path, help="sweep folders, results CSVs or curve CSVs")
    p.add_argument("--vs", help="the baseline arm: its name, a key=value of it, or a value (e.g. grpo_onpolicy)")
    p.add_argument("--arm", action="append", help="keep only this arm (name, key=value or value; repeatable); "
                                                  "the baseline is always kept")
    p.add_argument("--metric", help="a summary.json key (default: the test_mean_at_<n> most jobs have, else "
                                    "val_accuracy_end; a job without it is left out, named)")
    p.add_argument("--seed-key", action="append", help="override key(s) that are the seed (default: seed)")
    p.add_argument("--margin", type=float, help="TOST equivalence margin, in the metric's units (e.g. 0.02)")
    p.add_argument("--start", type=float, help="keep the jobs whose val_accuracy_start rounds to this (3 decimals)")
    p.add_argument("--out", type=Path, help="folder for report.md/.csv and the PNGs (default <sweep folder>/report; for a CSV multirun/report/<its name>)")
    p.add_argument("--curves-out", type=Path, help="write the compact per-run curves to this CSV")
    p.add_argument("--curve-every", type=int, default=10, help="a curve row every N optimizer steps (default 10)")
    return p


def load(p: argparse.ArgumentParser, args) -> tuple[list[Job], list[str], list, str | None, str]:
    """Read the inputs, name and filter the arms: (jobs, warnings, curve frames, the baseline arm, the metric).
    A bad argument ends in ``p.error`` (exit 2, naming it)."""
    import pandas as pd

    if args.margin is not None and not args.margin > 0:
        p.error(f"--margin must be positive, got {args.margin}")
    if args.curve_every < 1:
        p.error(f"--curve-every must be at least 1, got {args.curve_every}")
    seed_keys = args.seed_key or ["seed"]
    jobs, warnings, curve_files = [], [], []
    for path in args.inputs:
        if path.is_dir():
            found, left = read_sweep(path)
            if not found and not left:
                p.error(f"{path}: no job under it (no summary.json or .hydra/overrides.yaml)")
            jobs += found
            warnings += left
        elif path.suffix == ".csv" and path.exists():
            with path.open() as fh:
                header = next(csv.reader(fh), [])
            if "step" in header:
                curve_files.append(pd.read_csv(path, dtype={"seed": str}))
            else:
                try:
                    jobs += read_results_csv(path)
                except ValueError as err:
                    p.error(str(err))
        elif not path.exists():
            p.error(f"{path}: no such file or folder")
        else:
            p.error(f"{path}: not a sweep folder or a CSV file")
    if args.start is not None:
        starts = sorted({round(float(j.summary["val_accuracy_start"]), 3) for j in jobs
                         if j.summary.get("val_accuracy_start") is not None})
        jobs = [j for j in jobs if j.summary.get("val_accuracy_start") is not None
                and round(float(j.summary["val_accuracy_start"]), 3) == round(args.start, 3)]
        if not jobs:
            p.error(f"--start {args.start}: no job has that val_accuracy_start; the jobs have "
                    + (", ".join(f"{x:.3f}" for x in starts) or "none"))
    name_arms(jobs, seed_keys)
    arms = sorted({j.arm for j in jobs})
    vs = None
    try:
        if args.vs and jobs:
            vs = resolve_arm(args.vs, arms)
        if args.arm:
            keep = select_arms(args.arm, arms) | ({vs} if vs else set())
            jobs = [j for j in jobs if j.arm in keep]
    except ValueError as err:
        p.error(str(err))
    try:
        refuse_duplicate_jobs(jobs, seed_keys)
    except DuplicateRows as err:
        p.error(str(err))
    return jobs, warnings, curve_files, vs, args.metric or default_metric(jobs)


def _no_metric(p: argparse.ArgumentParser, args, jobs: list[Job], metric: str) -> None:
    """Exit (2) naming the metric no job has, whether it was given or the default, and the numeric keys there are."""
    keys = sorted({k for j in jobs for k, v in j.summary.items() if isinstance(v, (int, float))})
    given = f"--metric {metric}" if args.metric else f"no --metric given and no test_mean_at_<n> in any job, so {metric}"
    p.error(f"{given}: no job has a number for it; name one with --metric"
            + (f" (numeric keys: {', '.join(keys)})" if keys else ""))


def report_markdown(argv: list[str]) -> str:
    """The report's table with its legend and warnings for ``argv`` (as on the command line), written nowhere:
    the generated blocks of the docs embed it (``sweeps/doc_tables.py``).

    Raises:
        SystemExit: (2) on a bad argument or input, as the command line would.
    """
    p = parser()
    args = p.parse_args(argv)
    jobs, warnings, _, vs, metric = load(p, args)
    rows = build_table(jobs, metric, vs, args.margin, warnings) if jobs else []
    if not rows:
        _no_metric(p, args, jobs, metric)
    text = markdown(rows, metric, vs, args.margin)
    return text + ("\n\nWarnings:\n" + "\n".join(f"- {w}" for w in warnings) if warnings else "")


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    import pandas as pd

    jobs, warnings, curve_files, vs, metric = load(p, args)
    # a sweep's report stays with it; a CSV's (checked in, say) goes under multirun/, which git ignores
    out = args.out or (args.inputs[0] / "report" if args.inputs[0].is_dir() else Path("multirun/report") / args.inputs[0].stem)
    out.mkdir(parents=True, exist_ok=True)
    text = ""
    if jobs:
        rows = build_table(jobs, metric, vs, args.margin, warnings)
        if not rows:
            _no_metric(p, args, jobs, metric)
        text = markdown(rows, metric, vs, args.margin)
        blank_nan = lambda v: None if isinstance(v, float) and math.isnan(v) else v  # noqa: E731  (not defined)
        write_csv(out / "report.csv", ["metric", *CSV_FIELDS],
                  [{"metric": metric, **{k: blank_nan(v) for k, v in r.items()}} for r in rows])
        if vs and any(r["diff"] is not None for r in rows):
            plot_differences(rows, out, metric, vs)
    curve_rows = [row for j in jobs if Path(j.source).is_dir() for row in job_curves(j, args.curve_every)]
    curves = pd.concat([pd.DataFrame(curve_rows), *curve_files], ignore_index=True) if curve_rows or curve_files else None
    if curves is not None and len(curves):
        if args.curves_out:
            args.curves_out.parent.mkdir(parents=True, exist_ok=True)
            with replacing(args.curves_out, newline="") as fh:  # result rows: a reader sees the old file or the new
                pd.DataFrame(curve_rows).to_csv(fh, index=False, float_format="%.6g")
        plot_curves(curves, out, vs or args.vs)
    if not jobs:
        text = (f"no job rows in the inputs (curve files only): no statistics table; the figures are drawn from "
                f"{len(curves) if curves is not None else 0} curve rows")
    if warnings:
        text += "\n\nWarnings:\n" + "\n".join(f"- {w}" for w in warnings)
    write_text(out / "report.md", text + "\n")
    print(text)
    print(f"\nwritten: {', '.join(sorted(str(q) for q in out.iterdir()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
