"""The stale-samples rerun's tables and figures, from the rows in ``sweeps/results/`` (the analysis pre-registered
in docs/results/stale_samples.md, "Pre-registered rerun"; nothing here is typed by hand).

    python sweeps/stale_rerun.py              # print every block (the docs embed them: sweeps/doc_tables.py)
    python sweeps/stale_rerun.py --figures    # and draw the figures into docs/results/figures/

Inputs, one file per task (``default``, ``multistep``), all written by ``sweep_status.py --csv`` / ``report.py
--curves-out`` from the sweep folders:

- ``stale_tune_<task>.csv``: stage 1, one row per (arm, ``algo.learning_rate``, seed) with ``val_mean_at_16``;
- ``stale_headline_<task>.csv``: stage 2, one row per (arm, ``model.warmstart.seed``, seed) with
  ``test_mean_at_16``;
- ``stale_headline_<task>_curves.csv``: stage 2's compact curves (a row every 10 optimizer steps per run).

Stage 1 rule: per task and arm, the lr with the highest mean ``val_mean_at_16`` over the 3 tuning seeds; an exact
tie goes to the lower lr; a value that is not finite (a run stopped on a non-finite loss) counts as 0. Stage 2:
per task the comparisons H1-H3 paired on (warm start, seed), n = 15: mean difference, paired SE, percentile
bootstrap 95% interval, two-sided paired t-test (``grpolab.report.stats``), Holm's correction over the family of all 6
p-values (statsmodels), TOST at +-0.02. A block whose runs are not all in says "pending" with its count: no
comparison is drawn from part of a pre-registered grid.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from grpolab.report import stats  # noqa: E402
from grpolab.report.result_rows import DuplicateRows, refuse_duplicates, row_key  # noqa: E402

RESULTS = ROOT / "sweeps" / "results"
FIGURES = ROOT / "docs" / "results" / "figures"
TASKS = ("default", "multistep")
TUNE_ARMS = ("onpolicy", "grpo_async", "onpolicy_prev_window", "k4_ppo", "k10_ppo", "k10_offpolicy_grpo")
LRS = (2.5e-5, 5e-5, 1e-4)
TUNE_SEEDS = (100, 101, 102)
ARMS = ("onpolicy", "grpo_async", "onpolicy_prev_window")
WARM_STARTS = (0, 1, 2)
SEEDS = (0, 1, 2, 3, 4)
COMPARISONS = (("H1", "grpo_async", "onpolicy"), ("H2", "onpolicy_prev_window", "grpo_async"),
               ("H3", "onpolicy_prev_window", "onpolicy"))
MARGIN = 0.02
ALPHA = 0.05
WINDOWS = ((1, 20), (21, 50), (51, 100))  # optimizer steps of the first-100-steps table
DIAGNOSTICS = ("train_reward", "grad_norm", "clip_frac", "ratio_max", "kl_step", "kl_sampler_policy", "entropy")


def read_rows(path: Path, required: tuple[str, ...] = ("arm", "seed")) -> list[dict]:
    """A results CSV's rows (column -> text); ``[]`` when the file does not exist yet.

    Raises:
        ValueError: naming the file, when it lacks a required column.
    """
    if not path.exists():
        return []
    with path.open() as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: no {', '.join(missing)} column (columns: {', '.join(reader.fieldnames or [])})")
        return list(reader)


def _value(row: dict, metric: str, where: str) -> float:
    """A row's score. A non-finite one (``nan``, ``inf``: a run stopped on a non-finite loss) counts as 0, the
    pre-registered rule.

    Raises:
        ValueError: naming the row, for a missing or empty score (a row written without the metric).
    """
    text = row.get(metric)
    try:
        x = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: no number in column {metric!r} (got {text!r})") from None
    return x if math.isfinite(x) else 0.0


TUNE_KEY = ("arm", "algo.learning_rate", "seed")
HEADLINE_KEY = ("arm", "model.warmstart.seed", "seed")


def refuse_duplicate_rows(rows: list[dict], names: tuple[str, ...], where: str) -> None:
    """Raise :class:`~grpolab.report.result_rows.DuplicateRows` (``<where>: duplicate (key): line i and line j``) when two
    rows share a key: a run is one row, whatever its score; neither is kept."""
    try:
        refuse_duplicates(((row_key(r, names), f"line {i}") for i, r in enumerate(rows, start=2)), names)
    except DuplicateRows as err:
        raise DuplicateRows(f"{where}: {err}") from None


def select_lr(rows: list[dict], metric: str = "val_mean_at_16", arms=TUNE_ARMS, lrs=LRS, seeds=TUNE_SEEDS,
              where: str = "stale_tune rows"):
    """Stage 1's selection: per arm, the lr with the highest mean ``metric`` over ``seeds``; an exact tie goes to
    the lower lr.

    Args:
        rows: results rows with ``arm``, ``algo.learning_rate``, ``seed`` and ``metric``.
        where: names the rows in an error (their file).
    Returns:
        (cells, chosen, missing): cells[(arm, lr)] = (mean, SE, n); chosen[arm] = lr, or None where a cell lacks
        a seed; missing = the number of (arm, lr, seed) runs not in ``rows``.
    Raises:
        ValueError: naming the row, for a row without a score; :class:`~grpolab.report.result_rows.DuplicateRows` naming
            the key and the lines, for two rows of one (arm, lr, seed), with the same score or not.
    """
    refuse_duplicate_rows(rows, TUNE_KEY, where)
    got: dict[tuple, float] = {}
    for i, r in enumerate(rows, start=2):
        got[(r["arm"], float(r["algo.learning_rate"]), int(r["seed"]))] = _value(r, metric, f"line {i}")
    cells, chosen, missing = {}, {}, 0
    for arm in arms:
        complete = True
        for lr in lrs:
            values = [got[(arm, lr, s)] for s in seeds if (arm, lr, s) in got]
            missing += len(seeds) - len(values)
            complete &= len(values) == len(seeds)
            cells[(arm, lr)] = (*stats.mean_se(values), len(values)) if values else (math.nan, math.nan, 0)
        # max over (mean, -lr): the highest mean, and among exact ties the lowest lr
        chosen[arm] = max(lrs, key=lambda lr: (cells[(arm, lr)][0], -lr)) if complete else None
    return cells, chosen, missing


@dataclass
class Result:
    """One pre-registered comparison (arm minus base) on one task."""

    task: str
    name: str
    arm: str
    base: str
    paired: stats.Paired
    per_start: dict  # warm start -> mean paired difference over its seeds
    holm_p: float | None = None

    @property
    def p_warm_starts(self) -> float:
        """Not pre-registered, a check on clustering: the two-sided one-sample t-test of the 3 per-warm-start mean
        differences (df 2), which treats the warm start, not the run, as the unit."""
        return stats.one_sample_t(list(self.per_start.values()))[2]

    @property
    def verdict(self) -> str:
        """The pre-registered reading: "on par" (TOST p < 0.05), "better"/"worse" (Holm p < 0.05, by the sign),
        else "inconclusive"; "pending" while the family's Holm correction lacks a task."""
        if self.paired.tost_p is not None and self.paired.tost_p < ALPHA:
            return "on par"
        if self.holm_p is None:
            return "pending"
        if self.holm_p < ALPHA:
            return "better" if self.paired.diff > 0 else "worse"
        return "inconclusive"

    @property
    def robust(self) -> bool:
        """The mean paired difference has the same sign on every warm start."""
        signs = {math.copysign(1, d) for d in self.per_start.values() if d != 0}
        return len(signs) == 1 and all(d != 0 for d in self.per_start.values())


def headline_values(rows: list[dict], metric: str = "test_mean_at_16",
                    where: str = "stale_headline rows") -> tuple[dict, int]:
    """Stage 2's scores: values[arm][(warm start, seed)] and the number of the 45 runs not in ``rows``.

    Raises:
        DuplicateRows: naming the key and the lines (``where`` names the rows), for two rows of one (arm, warm
            start, seed).
    """
    refuse_duplicate_rows(rows, HEADLINE_KEY, where)
    values: dict[str, dict] = {arm: {} for arm in ARMS}
    for i, r in enumerate(rows, start=2):
        if r["arm"] in values:
            values[r["arm"]][(int(r["model.warmstart.seed"]), int(r["seed"]))] = _value(r, metric, f"line {i}")
    grid = {(w, s) for w in WARM_STARTS for s in SEEDS}
    missing = sum(len(grid - set(v)) for v in values.values())
    return values, missing


def compare_tasks(values_by_task: dict[str, dict]) -> list[Result]:
    """H1-H3 on every task whose 45 runs are in, Holm-corrected once all 6 p-values of the family exist."""
    from statsmodels.stats.multitest import multipletests

    results = []
    for task, values in values_by_task.items():
        for name, arm, base in COMPARISONS:
            paired = stats.compare(values[arm], values[base], margin=MARGIN)
            per_start = {w: float(sum(values[arm][(w, s)] - values[base][(w, s)] for s in SEEDS) / len(SEEDS))
                         for w in WARM_STARTS}
            results.append(Result(task, name, arm, base, paired, per_start))
    if len(results) == len(TASKS) * len(COMPARISONS):
        adjusted = multipletests([r.paired.p for r in results], alpha=ALPHA, method="holm")[1]
        for r, p in zip(results, adjusted):
            r.holm_p = float(p)
    return results


def _ci(paired: stats.Paired) -> str:
    """``[lo, hi]``, or the words for no interval (one pair, zero variance)."""
    return f"[{paired.ci[0]:+.3f}, {paired.ci[1]:+.3f}]" if paired.ci else f"none ({paired.note})"


def _ci_label(results: list[Result]) -> str:
    """The interval column's name: its method where every comparison has the same one."""
    labels = {r.paired.ci_label for r in results}
    return labels.pop() if len(labels) == 1 else "95% CI"


def _p(p: float | None) -> str:
    if p is None:
        return "pending"
    return "nan" if math.isnan(p) else (f"{p:.2g}" if p < 0.001 else f"{p:.3f}")


def stage1_block(tables: dict) -> str:
    """Markdown: per task, every (arm, lr) cell's mean +- SE of val mean@16 over the tuning seeds; the chosen lr
    in bold; below each task, the arms whose chosen lr is an edge of the grid (a better lr may lie beyond it)."""
    out = []
    for task, (cells, chosen, missing) in tables.items():
        out.append(f"**{task}** ({'all 54 runs' if not missing else f'pending: {missing} of 54 runs missing'})\n")
        out.append("| arm | " + " | ".join(f"lr {lr:g}" for lr in LRS) + " | chosen lr |")
        out.append("|---|" + "---|" * (len(LRS) + 1))
        for arm in TUNE_ARMS:
            row = []
            for lr in LRS:
                mean, se, n = cells[(arm, lr)]
                text = "-" if not n else f"{mean:.3f} +- {se:.3f}" + ("" if n == len(TUNE_SEEDS) else f" (n={n})")
                row.append(f"**{text}**" if chosen[arm] == lr else text)
            lr = chosen[arm]
            out.append(f"| `{arm}` | " + " | ".join(row) + f" | {'pending' if lr is None else f'{lr:g}'} |")
        for edge, lr, beyond in (("top", max(LRS), "higher"), ("bottom", min(LRS), "lower")):
            at = [f"`{a}`" for a in TUNE_ARMS if chosen[a] == lr]
            if at:
                out.append(f"\nAt the {edge} of the grid ({lr:g}, no {beyond} lr tried): {', '.join(at)}.")
        out.append("")
    out.append("Validation mean@16 on 1024 prompts, mean +- SE over the 3 tuning seeds (100-102) on the tuning warm "
               "start (`model.warmstart.seed=3`); bold: the lr the rule chose. Rows: "
               "`sweeps/results/stale_tune_<task>.csv`.")
    return "\n".join(out)


def headline_block(values_by_task: dict, missing_by_task: dict, results: list[Result]) -> str:
    """Markdown: per task, each arm's test mean@16 (mean +- SE over 15 runs, and per warm start), then H1-H3."""
    out = []
    for task in TASKS:
        if missing_by_task[task]:
            out.append(f"**{task}**: pending, {missing_by_task[task]} of the 45 runs not in "
                       f"`sweeps/results/stale_headline_{task}.csv`.\n")
            continue
        values = values_by_task[task]
        out.append(f"**{task}** (test mean@16, 1024 prompts)\n")
        out.append("| arm | mean +- SE (n=15) | " + " | ".join(f"warm start {w}: mean +- SE (n=5)" for w in WARM_STARTS)
                   + " |")
        out.append("|---|---|" + "---|" * len(WARM_STARTS))
        for arm in ARMS:
            cells = [stats.mean_se([values[arm][(w, s)] for s in SEEDS]) for w in WARM_STARTS]
            mean, se = stats.mean_se(list(values[arm].values()))
            out.append(f"| `{arm}` | {mean:.3f} +- {se:.3f} | " + " | ".join(f"{m:.3f} +- {e:.3f}" for m, e in cells)
                       + " |")
        out.append("")
        label = _ci_label([r for r in results if r.task == task])
        out.append(f"| | difference | paired diff +- SE (n=15) | {label} | p (paired t) | p (Holm, 6) | "
                   "TOST p (+-0.02) | per warm start 0 / 1 / 2 | p over warm starts (df 2) | reading |")
        out.append("|---|---|---|---|---|---|---|---|---|---|")
        for r in (r for r in results if r.task == task):
            per = " / ".join(f"{r.per_start[w]:+.3f}" for w in WARM_STARTS)
            reading = r.verdict + ("" if r.verdict == "pending" else
                                   ", same sign on all 3 warm starts" if r.robust else ", sign differs between warm starts")
            out.append(f"| {r.name} | `{r.arm}` - `{r.base}` | {r.paired.diff:+.3f} +- {r.paired.se:.3f} | "
                       f"{_ci(r.paired)} | {_p(r.paired.p)} | {_p(r.holm_p)} | "
                       f"{_p(r.paired.tost_p)} | {per} | {_p(r.p_warm_starts)} | {reading} |")
        out.append("")
    out.append("Paired on (warm start, seed): 3 warm starts x 5 seeds. SE: of the mean paired difference. p: two-sided "
               "paired t-test; Holm: over the family of 6 (3 comparisons x 2 tasks; pending while a task's rows are not "
               "all in). "
               "Reading as pre-registered: on par = TOST p < 0.05 (TOST is not corrected for multiplicity; where "
               "both TOST and Holm p < 0.05 the reading is on par: a difference inside the margin); better/worse = "
               "Holm p < 0.05. The paired t treats the 15 runs as independent although 5 share each warm start; "
               "the column p over warm starts (not pre-registered) is the t-test of the 3 per-warm-start means, "
               "the warm start as the unit. With few pairs the percentile bootstrap interval is narrower than a t "
               "interval: read the tests. Rows: `sweeps/results/stale_headline_<task>.csv`.")
    return "\n".join(out)


def conclusions_block(results: list[Result]) -> str:
    """The pre-registered conclusions, each with whether it holds on the rows in."""
    by = {(r.task, r.name): r for r in results}
    done = [t for t in TASKS if (t, "H1") in by]
    if len(done) < len(TASKS):
        return (f"Pending: the conclusions read the family of both tasks (in: {', '.join(done) or 'none'}).")
    verdict = {k: r.verdict for k, r in by.items()}
    lines = []
    trust = all(verdict[(t, "H2")] == "on par" and verdict[(t, "H3")] == "better" for t in TASKS)
    lines.append(f"- \"The gain is the trust region, asynchrony is neutral\" (H2 on par and H3 better, both tasks): "
                 f"**{'holds' if trust else 'does not hold'}** (H2: "
                 + ", ".join(f"{t} {verdict[(t, 'H2')]}" for t in TASKS) + "; H3: "
                 + ", ".join(f"{t} {verdict[(t, 'H3')]}" for t in TASKS) + ").")
    beyond = [t for t in TASKS if verdict[(t, "H2")] == "worse"]
    lines.append(f"- \"Asynchrony helps beyond the window\" (H2 worse on a task): "
                 f"**{'holds on ' + ', '.join(beyond) if beyond else 'does not hold'}**.")
    for t in TASKS:
        lines.append(f"- \"On par with on-policy, as the field reports\" (H1 on par), {t}: "
                     f"**{'holds' if verdict[(t, 'H1')] == 'on par' else 'does not hold'}** "
                     f"(H1 {verdict[(t, 'H1')]}).")
    ahead = [t for t in TASKS if verdict[(t, "H2")] == "better"]
    if ahead:  # the registered conclusions read H2 on par or worse only; say what "better" means, marked as such
        lines.append("")  # its own paragraph, apart from the registered conclusions
        lines.append(f"Not pre-registered (no registered conclusion reads it): H2 better on {', '.join(ahead)}: the "
                     "same window on the same ratio pi/pi_(t-1), fed fresh samples (`onpolicy_prev_window`), ends "
                     "above it fed one-step-stale ones (`grpo_async`): there the staleness costs accuracy.")
    return "\n".join(lines)


def recommendation_block(results: list[Result]) -> str:
    """The recommendation, by a rule fixed before stage 2's results were read: from H1 (asynchronous generation)
    and H3 (the window in on-policy training) on both tasks, after Holm."""
    by = {(r.task, r.name): r.verdict for r in results}
    if len({t for t, _ in by}) < len(TASKS):
        return "Pending: the recommendation reads both tasks' comparisons (after Holm over the family of 6)."
    return recommendation_table(by, "the rerun") + "\n\n" + firmness_line([r for r in results
                                                                             if r.name in ("H1", "H3")])


def recommendation_table(by: dict[tuple[str, str], str], source: str) -> str:
    """The recommendation rule (fixed before the rerun's stage 2 was read) applied to readings ``by[(task, H)]``
    ("better", "worse", "on par", "inconclusive") of H1 and H3 on every task: a markdown table whose column says
    whose readings (``source``) it follows. The replication applies the same rule to its own readings."""

    def on(name, verdict):
        return [t for t in TASKS if by[(t, name)] == verdict]

    def listing(name):
        return ", ".join(f"{t} {by[(t, name)]}" for t in TASKS)

    if len(on("H1", "better")) == len(TASKS):
        asynchronous = "`algo=grpo_async`: above on-policy GRPO on both tasks"
    elif len(on("H1", "on par")) == len(TASKS):
        asynchronous = "`algo=grpo_async`: on par with on-policy GRPO (within +-0.02) on both tasks; take it for its throughput"
    elif not on("H1", "worse") and len(on("H1", "better") + on("H1", "on par")) == len(TASKS):
        asynchronous = f"`algo=grpo_async`: at or above on-policy GRPO ({listing('H1')})"
    elif on("H1", "worse"):
        asynchronous = f"on-policy GRPO: `algo=grpo_async` trails it on {', '.join(on('H1', 'worse'))}"
    else:
        asynchronous = (f"either: {source} does not tell `algo=grpo_async` from on-policy GRPO on accuracy "
                        f"({listing('H1')}); choose by throughput")
    if len(on("H3", "better")) == len(TASKS):
        window = ("`algo=grpo_onpolicy_prev_window`: the PPO window against the previous step's policy lifts on-policy "
                  "GRPO on both tasks (one extra forward per step)")
    elif on("H3", "worse"):
        window = f"plain on-policy GRPO: the window costs accuracy on {', '.join(on('H3', 'worse'))}"
    else:
        window = f"plain on-policy GRPO: the window's effect is not established ({listing('H3')})"
    return (f"| you want | use ({source}'s reading) |\n|---|---|\n"
            f"| asynchronous generation (lag 1) | {asynchronous} |\n| on-policy training | {window} |")


def firmness_line(results: list[Result]) -> str:
    """Under the recommendation (not part of its pre-registered rule): how firm each comparison it reads is once
    the warm start, not the run, is the unit, and whether its sign holds on every warm start."""
    parts = []
    for r in results:
        sign = "the same sign on every warm start" if r.robust else "signs that differ between warm starts"
        parts.append(f"{r.task} {r.name} p = {_p(r.p_warm_starts)}, {sign}")
    return ("How firm (not pre-registered): with the warm start as the unit (t over the 3 warm-start means, df 2): "
            + "; ".join(parts) + ". The 15 runs per arm come from 3 warm starts: more warm starts, not more seeds, "
            "would firm this up.")


def first100_block(curves_by_task: dict) -> str:
    """Markdown: per task and arm, the diagnostics averaged over the runs in the windows of the first 100 steps
    (mean over runs of each run's mean over the window's curve rows; +- SE over runs)."""
    out = []
    for task, curves in curves_by_task.items():
        if curves is None:
            out.append(f"**{task}**: pending (no `sweeps/results/stale_headline_{task}_curves.csv`).\n")
            continue
        out.append(f"**{task}** (mean +- SE over runs)\n")
        out.append("| arm | steps | " + " | ".join(DIAGNOSTICS) + " |")
        out.append("|---|---|" + "---|" * len(DIAGNOSTICS))
        for arm in ARMS:
            d = curves[curves["arm"] == arm]
            for lo, hi in WINDOWS:
                w = d[(d["step"] >= lo) & (d["step"] <= hi)]
                cells = []
                for col in DIAGNOSTICS:
                    per_run = w.groupby("seed")[col].mean().dropna() if col in w else []
                    cells.append("-" if not len(per_run) else "{:.4g} +- {:.2g}".format(*stats.mean_se(list(per_run))))
                out.append(f"| `{arm}` | {lo}-{hi} | " + " | ".join(cells) + " |")
        out.append("")
    out.append("Each curve row is the mean of its 10 optimizer steps; grad_norm: before clipping; clip_frac: the "
               "fraction of tokens whose ratio is clipped; ratio_max: the largest importance ratio of a step; kl_step: the KL between consecutive policies "
               "(`train/lower_bound/kl_step`); kl_sampler_policy: the KL between the sampler and the policy (0 on-policy); "
               "entropy: per token. Rows: `sweeps/results/stale_headline_<task>_curves.csv`.")
    return "\n".join(out)


def read_curves(path: Path):
    """A compact curve CSV with ``arm`` reduced to its value (``correction_arm=onpolicy`` -> ``onpolicy``)."""
    import pandas as pd

    if not path.exists():
        return None
    curves = pd.read_csv(path, dtype={"seed": str})
    curves["arm"] = curves["arm"].map(lambda a: a.split(" ")[0].split("=", 1)[-1])
    return curves


def draw(curves_by_task: dict) -> list[Path]:
    """Per task with curves: the learning curves (report.py's figure) and the first-150-steps diagnostics."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sys.path.insert(0, str(ROOT / "sweeps"))
    from report import plot_curves

    written = []
    FIGURES.mkdir(parents=True, exist_ok=True)
    for task, curves in curves_by_task.items():
        if curves is None:
            continue
        tmp = FIGURES / f".stale_rerun_{task}"
        tmp.mkdir(exist_ok=True)
        target = FIGURES / f"stale_rerun_{task}_curves.png"
        plot_curves(curves, tmp, "onpolicy").replace(target)
        tmp.rmdir()
        written.append(target)
        fig, axes = plt.subplots(1, len(DIAGNOSTICS), figsize=(4 * len(DIAGNOSTICS), 3.4))
        early = curves[curves["step"] <= 150]
        for j, arm in enumerate(ARMS):
            d = early[early["arm"] == arm]
            for ax, col in zip(axes, DIAGNOSTICS):
                g = d.dropna(subset=[col]).groupby("step")[col]
                mean, se = g.mean(), g.std(ddof=1) / g.count() ** 0.5
                ax.plot(mean.index, mean, color=f"C{j}", label=arm)
                ax.fill_between(mean.index, mean - se, mean + se, color=f"C{j}", alpha=0.2, lw=0)
                ax.set_title(col)
                ax.set_xlabel("optimizer step")
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{task}: first 150 steps, mean +- SE over runs")
        fig.tight_layout()
        target = FIGURES / f"stale_rerun_{task}_first150.png"
        fig.savefig(target, dpi=100)
        plt.close(fig)
        written.append(target)
    return written


def blocks(results_dir: Path = RESULTS) -> dict[str, str]:
    """Every generated block's markdown, by name, from the CSVs under ``results_dir``."""
    if not results_dir.is_dir():
        raise ValueError(f"{results_dir}: no such folder (the rows live in sweeps/results/)")
    tables = {t: select_lr(read_rows(results_dir / f"stale_tune_{t}.csv", TUNE_KEY),
                           where=str(results_dir / f"stale_tune_{t}.csv")) for t in TASKS}
    values, missing = {}, {}
    for t in TASKS:
        path = results_dir / f"stale_headline_{t}.csv"
        values[t], missing[t] = headline_values(read_rows(path, HEADLINE_KEY), where=str(path))
    results = compare_tasks({t: values[t] for t in TASKS if not missing[t]})
    curves = {t: read_curves(results_dir / f"stale_headline_{t}_curves.csv") for t in TASKS}
    return {"stage1": stage1_block(tables), "headline": headline_block(values, missing, results),
            "conclusions": conclusions_block(results), "recommendation": recommendation_block(results),
            "first100": first100_block(curves)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--figures", action="store_true", help="draw the figures into docs/results/figures/ too")
    p.add_argument("--results", type=Path, default=RESULTS, help="the folder of the CSVs (default sweeps/results)")
    args = p.parse_args(argv)
    try:
        generated = blocks(args.results)
    except ValueError as err:
        p.error(str(err))
    for name, text in generated.items():
        print(f"## {name}\n\n{text}\n")
    if args.figures:
        curves = {t: read_curves(args.results / f"stale_headline_{t}_curves.csv") for t in TASKS}
        for path in draw(curves):
            print(f"drew {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
