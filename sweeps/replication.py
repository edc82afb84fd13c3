"""The stale-samples replication on fresh warm starts (pre-registered in docs/results/stale_samples.md,
"Pre-registered replication"): its registered design, the lr edge step's rule, and the analysis with the warm start
as the unit. Every block of the page's replication results is generated from the rows (``sweeps/doc_tables.py``);
a block whose rows are not all in says "pending" with its count.

    python sweeps/replication.py                   # print every block
    python sweeps/replication.py --tuned-lr default  # the tuned_lr.<arm>=<lr> overrides of a task's runs

Inputs, under ``sweeps/results/`` (``sweep_status.py --csv``):

- ``stale_tune_default.csv`` (stage 1 of the rerun) and ``replication_edge_default.csv`` (the edge step: the three
  arms at lr 2e-4 on the tuning warm start, seeds 100-102, ``val_mean_at_16``);
- ``replication_<task>.csv``: one row per (arm, ``model.warmstart.seed``, seed) with ``learning_rate``,
  ``test_mean_at_16``, ``test_greedy_accuracy``, ``test_pass_at_<k>`` and ``train_entropy_end``.

The analysis: per task and comparison H, the mean paired difference of each warm start (over its 2 seeds), then the
two-sided one-sample t over the 12 warm-start means (df 11; the balanced mixed model's exact test), its 95% t
interval and the 90% interval TOST reads; Holm over the primary family (H2 on both tasks) and over the secondary
family (H1 and H3 on both tasks), of the t p-values and of the TOST p-values each; the registered reading of each
outcome (:data:`READINGS`). Secondary readouts (greedy accuracy, pass@k, final entropy): the same t over warm-start
means, uncorrected, with the registered words for each sign.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "sweeps"))

import stale_rerun  # noqa: E402

from grpolab.report import stats  # noqa: E402
from grpolab.report.result_rows import cell  # noqa: E402

RESULTS = ROOT / "sweeps" / "results"
TASKS = stale_rerun.TASKS
ARMS = stale_rerun.ARMS  # onpolicy, grpo_async, onpolicy_prev_window
COMPARISONS = stale_rerun.COMPARISONS  # H1 grpo_async - onpolicy, H2 window - grpo_async, H3 window - onpolicy
# Warm-start seeds used before the replication (every results CSV and config): 0 (every earlier screen, the
# model's default), 0-2 (the rerun's headline), 3 (its tuning). The replication's are fresh, distinct per task.
USED_WARM_STARTS = (0, 1, 2, 3)
WARM_STARTS = {"default": tuple(range(10, 22)), "multistep": tuple(range(30, 42))}
SEEDS = (200, 201)  # run seeds, none used before (the rerun: 0-4 and tuning 100-102)
STAGE1_LR = {"default": dict.fromkeys(ARMS, 1e-4), "multistep": dict.fromkeys(ARMS, 5e-5)}  # the rerun's stage 1
EDGE_TASK, EDGE_LR = "default", 2e-4  # the edge step: default's three arms chose 1e-4, the grid's top
EDGE_LRS = (*stale_rerun.LRS, EDGE_LR)
MARGIN = 0.02
ALPHA = 0.05
PRIMARY, SECONDARY = ("H2",), ("H1", "H3")
METRIC = "test_mean_at_16"
READOUTS = (("test_greedy_accuracy", "greedy accuracy"), ("test_pass_at_4", "pass@4"), ("test_pass_at_16", "pass@16"))
ENTROPY = ("train_entropy_end", "final entropy")
KEY = ("arm", "model.warmstart.seed", "seed")
EDGE_KEY = ("arm", "algo.learning_rate", "seed")

# The registered reading of each outcome of each comparison (docs/results/stale_samples.md quotes them).
READINGS = {
    ("H1", "better"): "lag-1 asynchrony with its window ends above on-policy GRPO, each at its tuned lr",
    ("H1", "worse"): "lag-1 asynchrony with its window ends below on-policy GRPO: it costs accuracy here",
    ("H1", "on par"): "on par with on-policy GRPO within the margin, as the field reports",
    ("H1", "inconclusive"): "neither a difference nor parity within the margin is shown; the intervals say what "
                            "remains possible",
    ("H2", "better"): "fresh samples under the same window end above one-step-stale ones: one step of staleness "
                      "costs accuracy, and asynchrony adds nothing to the window but throughput",
    ("H2", "worse"): "one-step-stale samples under the window end above fresh ones: asynchrony helps beyond the "
                     "window",
    ("H2", "on par"): "one step of staleness under the window is neutral within the margin: asynchrony neither "
                      "adds to the window nor costs accuracy",
    ("H2", "inconclusive"): "the mechanism is not settled at 12 warm starts: neither a difference nor parity within "
                            "the margin; the intervals say what remains possible",
    ("H3", "better"): "the window against the previous step's policy (its masking of tokens that moved more than "
                      "eps, and its reweighting toward the last step's move; not an importance correction on fresh "
                      "samples) lifts on-policy GRPO",
    ("H3", "worse"): "the window against the previous step's policy costs on-policy GRPO accuracy",
    ("H3", "on par"): "the window neither lifts nor lowers on-policy GRPO beyond the margin",
    ("H3", "inconclusive"): "the window's effect on on-policy GRPO is not settled at 12 warm starts; the intervals "
                            "say what remains possible",
}
READOUT_WORDS = {
    "survives": "the gain survives: same sign as the mean@16 difference, 95% interval excludes 0",
    "reverses": "the sign reverses: 95% interval on the other side of 0 from the mean@16 difference",
    "not shown": "not distinguishable from 0 (95% interval holds 0)",
}
SHARPENING = {
    "reverses": "consistent with sharpening: mean@16 up, pass@16 down (the mass moves onto answers the base "
                "already reached, fewer prompts solved within 16 samples)",
    "survives": "not sharpening alone: more prompts solved within 16 samples too",
    "not shown": "pass@16 does not tell: sharpening is not ruled out",
}


def family_sizes() -> dict[str, int]:
    """Each comparison's Holm family size: H2 on both tasks (primary), H1 and H3 on both tasks (secondary)."""
    return {**dict.fromkeys(PRIMARY, len(PRIMARY) * len(TASKS)), **dict.fromkeys(SECONDARY, len(SECONDARY) * len(TASKS))}


# ------------------------------------------------------------------------------------------------ edge step
def edge_step(stage1_rows: list[dict], edge_rows: list[dict], where: str = "edge rows"):
    """The edge step's choice on ``EDGE_TASK``: per arm, stage 1's rule over stage 1's lrs and 2e-4 (the highest
    mean ``val_mean_at_16`` over seeds 100-102; an exact tie to the lower lr; a non-finite value counts 0).

    Returns:
        (cells, chosen, missing) as :func:`stale_rerun.select_lr`; chosen[arm] is None while a cell lacks a seed.
    Raises:
        ValueError: an edge row from another warm start than stage 1's (its ``val_accuracy_start`` differs), a
            duplicate (arm, lr, seed).
    """
    own = [r for r in stage1_rows if r["arm"] in ARMS]
    starts = {cell(r.get("val_accuracy_start")) for r in own}
    for i, r in enumerate(edge_rows, start=2):
        if "val_accuracy_start" in r and starts and cell(r["val_accuracy_start"]) not in starts:
            raise ValueError(f"{where} line {i}: val_accuracy_start {r['val_accuracy_start']} is not stage 1's "
                             f"({', '.join(sorted(starts))}): another warm start or CPU, not comparable")
    return stale_rerun.select_lr([*own, *edge_rows], arms=ARMS, lrs=EDGE_LRS, seeds=stale_rerun.TUNE_SEEDS,
                                 where=where)


def registered_lrs(results_dir: Path = RESULTS) -> dict[str, dict[str, float | None]]:
    """The replication's lr per task and arm: stage 1's, except on ``EDGE_TASK`` the edge step's choice (None
    while its rows are not all in)."""
    lrs = {t: dict(STAGE1_LR[t]) for t in TASKS}
    _, chosen, _ = edge_step(*_edge_inputs(results_dir))
    lrs[EDGE_TASK] = dict(chosen)
    return lrs


def _edge_inputs(results_dir: Path):
    stage1 = results_dir / f"stale_tune_{EDGE_TASK}.csv"
    edge = results_dir / f"replication_edge_{EDGE_TASK}.csv"
    return (stale_rerun.read_rows(stage1, stale_rerun.TUNE_KEY), stale_rerun.read_rows(edge, EDGE_KEY),
            str(edge))


# --------------------------------------------------------------------------------------------- replication
def read_replication(rows: list[dict], task: str, lrs: dict[str, float | None], where: str):
    """A task's replication rows: ``values[column][arm][(warm start, seed)]`` for the metric and every readout
    column the rows hold a number for in every row, and the number of registered runs not in the rows.

    Raises:
        ValueError: a row outside the registered grid (warm start, seed or arm), a row whose ``learning_rate``
            is not its arm's registered lr (or rows before the edge step chose it), a duplicate key, a row
            without a score.
    """
    stale_rerun.refuse_duplicate_rows(rows, KEY, where)
    grid = {(w, s) for w in WARM_STARTS[task] for s in SEEDS}
    if not rows:
        return {}, len(ARMS) * len(grid)
    optional = [*(c for c, _ in READOUTS), ENTROPY[0]]
    columns = [METRIC, *(c for c in optional if all(cell(r.get(c)) != "" for r in rows))]
    values = {c: {arm: {} for arm in ARMS} for c in columns}
    for i, r in enumerate(rows, start=2):
        arm, w, s = r["arm"], int(float(r["model.warmstart.seed"])), int(float(r["seed"]))
        if arm not in ARMS or w not in WARM_STARTS[task] or s not in SEEDS:
            raise ValueError(f"{where} line {i}: ({arm}, warm start {w}, seed {s}) is not in the registered grid "
                             f"(arms {', '.join(ARMS)}; warm starts {WARM_STARTS[task][0]}-{WARM_STARTS[task][-1]}; "
                             f"seeds {', '.join(map(str, SEEDS))}): nothing is added after looking")
        lr = lrs.get(arm)
        if lr is None:
            raise ValueError(f"{where} line {i}: a row of {arm} before the edge step chose its lr (the edge step's "
                             "runs precede the replication's)")
        got = r.get("learning_rate")
        if got in (None, "") or not math.isclose(float(got), lr, rel_tol=1e-9):
            raise ValueError(f"{where} line {i}: {arm} ran at learning_rate {got!r}, not its registered {lr:g}")
        for c in columns:
            values[c][arm][(w, s)] = stale_rerun._value(r, c, f"{where} line {i}")
    return values, sum(len(grid - set(values[METRIC][arm])) for arm in ARMS)


@dataclass
class WarmStartTest:
    """One comparison (arm minus base) of one column on one task, the warm start as the unit."""

    task: str
    name: str
    arm: str
    base: str
    column: str
    per_start: dict  # warm start -> mean paired difference over its seeds
    holm_p: float | None = None
    holm_tost_p: float | None = None
    primary_sign: float = 1.0  # a readout's: the sign of the mean@16 difference it is read against

    @property
    def means(self) -> list[float]:
        return list(self.per_start.values())

    @property
    def diff(self) -> float:
        return stats.mean_se(self.means)[0]

    @property
    def se(self) -> float:
        return stats.mean_se(self.means)[1]

    @property
    def df(self) -> int:
        return len(self.means) - 1

    @property
    def t(self) -> float:
        return stats.one_sample_t(self.means)[0]

    @property
    def p(self) -> float:
        return stats.one_sample_t(self.means)[2]

    @property
    def ci95(self) -> tuple[float, float]:
        return stats.t_interval(self.means, 0.95)

    @property
    def ci90(self) -> tuple[float, float]:
        return stats.t_interval(self.means, 0.90)

    @property
    def tost_p(self) -> float:
        return stats.tost(self.means, MARGIN)

    @property
    def positive(self) -> int:
        return sum(d > 0 for d in self.means)

    @property
    def verdict(self) -> str:
        """The registered reading: "on par" (Holm-adjusted TOST p < alpha, also where the difference test rejects
        too: a difference inside the margin), else "better"/"worse" (Holm-adjusted t p < alpha, by the sign), else
        "inconclusive"; "pending" before the family's Holm correction."""
        if self.holm_p is None or self.holm_tost_p is None:
            return "pending"
        if self.holm_tost_p < ALPHA:
            return "on par"
        if self.holm_p < ALPHA:
            return "better" if self.diff > 0 else "worse"
        return "inconclusive"

    @property
    def readout(self) -> str:
        """A secondary readout's words against the mean@16 difference's sign (set by :func:`readouts`)."""
        lo, hi = self.ci95
        if math.isnan(lo) or lo <= 0 <= hi:
            return "not shown"
        return "survives" if (lo > 0) == (self.primary_sign > 0) else "reverses"


def warm_start_test(values: dict, task: str, name: str, arm: str, base: str, column: str) -> WarmStartTest:
    """The per-warm-start mean differences of ``column`` (``values[arm][(w, s)]``) over the registered seeds."""
    per_start = {w: sum(values[arm][(w, s)] - values[base][(w, s)] for s in SEEDS) / len(SEEDS)
                 for w in WARM_STARTS[task]}
    return WarmStartTest(task, name, arm, base, column, per_start)


def holm(tests: list[WarmStartTest]) -> None:
    """Holm's correction (statsmodels) of each family's t p-values and TOST p-values, in place; only once every
    task is in (a family spans both tasks)."""
    from statsmodels.stats.multitest import multipletests

    if {t.task for t in tests} != set(TASKS):
        return
    for family in (PRIMARY, SECONDARY):
        members = [t for t in tests if t.name in family]
        for attr, raw in (("holm_p", [t.p for t in members]), ("holm_tost_p", [t.tost_p for t in members])):
            if any(math.isnan(p) for p in raw):
                continue  # a zero-variance comparison has no test: the family stays pending, said by its p
            for t, p in zip(members, multipletests(raw, alpha=ALPHA, method="holm")[1]):
                setattr(t, attr, float(p))


def analyse(values_by_task: dict[str, dict]) -> list[WarmStartTest]:
    """H1-H3 on ``METRIC`` for every task given (all its runs in), Holm-corrected once both tasks are in."""
    tests = [warm_start_test(v[METRIC], task, name, arm, base, METRIC)
             for task, v in values_by_task.items() for name, arm, base in COMPARISONS]
    holm(tests)
    return tests


def readouts(values_by_task: dict[str, dict], primary: list[WarmStartTest]) -> list[WarmStartTest]:
    """The secondary readouts (greedy accuracy, pass@k, final entropy), per task and comparison, uncorrected."""
    sign = {(t.task, t.name): t.diff for t in primary}
    out = []
    for task, v in values_by_task.items():
        for column in [*(c for c, _ in READOUTS), ENTROPY[0]]:
            if column not in v:
                continue
            for name, arm, base in COMPARISONS:
                t = warm_start_test(v[column], task, name, arm, base, column)
                t.primary_sign = sign.get((task, name), 1.0)
                out.append(t)
    return out


# -------------------------------------------------------------------------------------------------- blocks
def _p(p: float | None) -> str:
    return stale_rerun._p(p)


def _ci(ci: tuple[float, float]) -> str:
    return "none" if math.isnan(ci[0]) else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def edge_block(cells: dict, chosen: dict, missing: int) -> str:
    """Markdown: the edge step's cells at 1e-4 (stage 1) and 2e-4, the chosen lr, and the replication's lrs."""
    out = [f"**{EDGE_TASK}**, tuning warm start 3, seeds 100-102 "
           f"({'all 9 edge runs in' if not missing else f'pending: {missing} of the 9 edge runs not in'})\n",
           "| arm | lr 0.0001 (stage 1) | lr 0.0002 (edge step) | chosen lr | the replication's lr |",
           "|---|---|---|---|---|"]
    for arm in ARMS:
        row = []
        for lr in (1e-4, EDGE_LR):
            mean, se, n = cells[(arm, lr)]
            text = "-" if not n else f"{mean:.3f} +- {se:.3f}" + ("" if n == 3 else f" (n={n})")
            row.append(f"**{text}**" if chosen[arm] == lr else text)
        lr = chosen[arm]
        out.append(f"| `{arm}` | " + " | ".join(row) + f" | {'pending' if lr is None else f'{lr:g}'} | "
                   f"{'pending' if lr is None else f'{lr:g}'} |")
    out.append("")
    moved = [f"`{a}`" for a in ARMS if chosen[a] == EDGE_LR]
    if missing:
        out.append("The replication's `default` runs wait for this step (its runs precede theirs).")
    elif moved:
        out.append(f"Moved to 2e-4 (the replication uses it; 2e-4 is again the top of what was tried): "
                   f"{', '.join(moved)}.")
    else:
        out.append("No arm's best moved: the replication runs `default` at stage 1's lrs.")
    out.append("\nValidation mean@16 on 1024 prompts, mean +- SE over the 3 tuning seeds; bold: the lr the rule "
               f"chose over {', '.join(f'{lr:g}' for lr in EDGE_LRS)} (lower lrs: the stage 1 table). "
               f"`multistep` runs at stage 1's lrs ({STAGE1_LR['multistep']['onpolicy']:g}, inside the grid). Rows: "
               f"`sweeps/results/stale_tune_{EDGE_TASK}.csv`, `sweeps/results/replication_edge_{EDGE_TASK}.csv`.")
    return "\n".join(out)


def results_block(values_by_task: dict, missing_by_task: dict, tests: list[WarmStartTest]) -> str:
    """Markdown: per task, each arm's mean over warm-start means, then H1-H3 with the warm start as the unit."""
    n_runs = len(ARMS) * len(SEEDS) * len(WARM_STARTS["default"])
    out = []
    for task in TASKS:
        if missing_by_task[task]:
            out.append(f"**{task}**: pending, {missing_by_task[task]} of the {n_runs} runs not in "
                       f"`sweeps/results/replication_{task}.csv`.\n")
            continue
        values = values_by_task[task][METRIC]
        w0, w1 = WARM_STARTS[task][0], WARM_STARTS[task][-1]
        out.append(f"**{task}** (test mean@16, 1024 prompts; warm starts {w0}-{w1} x seeds "
                   f"{', '.join(map(str, SEEDS))})\n")
        out.append("| arm | mean +- SE over the 12 warm-start means |")
        out.append("|---|---|")
        for arm in ARMS:
            means = [sum(values[arm][(w, s)] for s in SEEDS) / len(SEEDS) for w in WARM_STARTS[task]]
            m, se = stats.mean_se(means)
            out.append(f"| `{arm}` | {m:.3f} +- {se:.3f} |")
        out.append("")
        out.append("| | difference | mean +- SE (12 warm starts) | 95% CI | 90% CI | t (df 11) | p | p (Holm) | "
                   f"TOST p (+-{MARGIN:g}) | TOST p (Holm) | warm starts > 0 | reading |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in (r for r in tests if r.task == task):
            reading = r.verdict if r.verdict == "pending" else f"**{r.verdict}**: {READINGS[(r.name, r.verdict)]}"
            out.append(f"| {r.name} | `{r.arm}` - `{r.base}` | {r.diff:+.3f} +- {r.se:.3f} | {_ci(r.ci95)} | "
                       f"{_ci(r.ci90)} | {r.t:+.2f} | {_p(r.p)} | {_p(r.holm_p)} | {_p(r.tost_p)} | "
                       f"{_p(r.holm_tost_p)} | {r.positive} of {len(r.means)} | {reading} |")
        out.append("")
    out.append("The unit is the warm start: each warm start's mean paired difference over its 2 seeds, then the "
               "two-sided one-sample t over the 12 means (df 11). Holm: over H2 on both tasks (primary, 2) and "
               "over H1 and H3 on both tasks (secondary, 4), of the t p-values and of the TOST p-values apart; "
               "pending while a task's rows are not all in. Reading as registered: on par = Holm-adjusted TOST p "
               "< 0.05 (the 90% interval inside the margin; also where the difference test rejects too, a "
               "difference inside the margin); better/worse = Holm-adjusted p < 0.05 by the sign; otherwise "
               "inconclusive. The 90% interval gives the margin at which parity would hold. Rows: "
               "`sweeps/results/replication_<task>.csv`.")
    return "\n".join(out)


def readouts_block(missing_by_task: dict, tests: list[WarmStartTest]) -> str:
    """Markdown: per task, greedy accuracy, pass@k and final entropy differences, the warm start as the unit."""
    names = dict([*READOUTS, ENTROPY])
    out = []
    for task in TASKS:
        if missing_by_task[task]:
            out.append(f"**{task}**: pending (the replication's rows are not all in).\n")
            continue
        mine = [t for t in tests if t.task == task]
        absent = [names[c] for c in names if not any(t.column == c for t in mine)]
        out.append(f"**{task}**\n")
        if mine:
            out.append("| | difference | readout | mean +- SE (12 warm starts) | 95% CI | p | reading |")
            out.append("|---|---|---|---|---|---|---|")
            for t in mine:
                if t.column == ENTROPY[0]:
                    lo, hi = t.ci95
                    words = ("lower entropy" if hi < 0 else "higher entropy" if lo > 0 else
                             "not distinguishable from 0") if not math.isnan(lo) else "no interval"
                else:
                    words = READOUT_WORDS[t.readout]
                    if t.column == "test_pass_at_16" and t.name in ("H2", "H3"):
                        words += f"; {SHARPENING[t.readout]}"
                out.append(f"| {t.name} | `{t.arm}` - `{t.base}` | {names[t.column]} | {t.diff:+.3f} +- {t.se:.3f} | "
                           f"{_ci(t.ci95)} | {_p(t.p)} | {words} |")
        if absent:
            out.append(f"\nNot in the rows: {', '.join(absent)}.")
        out.append("")
    out.append("Secondary, not corrected for multiplicity: the same t over the 12 warm-start means. Greedy accuracy "
               "and pass@k from the final eval (`test_greedy_accuracy`: one greedy completion per prompt; "
               "`test_pass_at_<k>`: the unbiased estimator from the 16 samples); final entropy: the mean per-token "
               "entropy of the training completions over the last 10 optimizer steps (`train_entropy_end`). Rows: "
               "`sweeps/results/replication_<task>.csv`.")
    return "\n".join(out)


# The rerun's registered conclusions, re-read on the replication's readings (per task).
CONCLUSIONS = (
    ("the gain is the window, asynchrony is neutral", lambda v: v["H2"] == "on par" and v["H3"] == "better",
     "H2 on par and H3 better"),
    ("asynchrony helps beyond the window", lambda v: v["H2"] == "worse", "H2 worse"),
    ("one step of staleness costs accuracy under the window", lambda v: v["H2"] == "better", "H2 better"),
    ("on par with on-policy GRPO, as the field reports", lambda v: v["H1"] == "on par", "H1 on par"),
    ("the window lifts on-policy GRPO", lambda v: v["H3"] == "better", "H3 better"),
)


def conclusions_block(tests: list[WarmStartTest], rerun_verdicts: dict) -> str:
    """Markdown: per task, each registered conclusion (holds / does not hold), and whether each of the rerun's
    readings (the run as the unit, ``rerun_verdicts[(task, name)]``) replicates with the warm start as the unit."""
    by = {(t.task, t.name): t.verdict for t in tests}
    if len({t for t, _ in by}) < len(TASKS) or "pending" in by.values():
        return "Pending: the conclusions read both tasks' comparisons (after Holm over each family)."
    out = []
    for task in TASKS:
        v = {name: by[(task, name)] for name, _, _ in COMPARISONS}
        said = "; ".join(f"{what} ({rule}): **{'holds' if test(v) else 'does not hold'}**"
                         for what, test, rule in CONCLUSIONS)
        out.append(f"- {task}: {said}.")
    out.append("")
    out.append("| task | H | the rerun (3 warm starts x 5 seeds, the run as the unit) | the replication (12 fresh warm "
               "starts x 2 seeds, the warm start as the unit) | |")
    out.append("|---|---|---|---|---|")
    for task in TASKS:
        for name, _, _ in COMPARISONS:
            old, new = rerun_verdicts.get((task, name), "-"), by[(task, name)]
            out.append(f"| {task} | {name} | {old} | {new} | {'replicates' if old == new else 'does not replicate'} |")
    return "\n".join(out)


def achieved_power(values_by_task: dict, missing_by_task: dict, results_dir: Path) -> dict:
    """Per complete task and comparison: the variance components of the replication's paired differences and the
    power of the registered tests they give, beside those the rerun's components gave: ``{"now": Components,
    "se": SE of the mean, "t": [achieved, achieved upper, planned, planned upper], "tost": [...]}``; t power for a
    true difference of +-``MARGIN``, TOST power for a true difference of 0, each at Holm's first step."""
    import replication_power as rp

    seeds, starts = len(SEEDS), len(WARM_STARTS["default"])
    out = {}
    for task in (t for t in TASKS if not missing_by_task[t]):
        headline = stale_rerun.read_rows(results_dir / f"stale_headline_{task}.csv", stale_rerun.HEADLINE_KEY)
        values = values_by_task[task][METRIC]
        for name, arm, base in COMPARISONS:
            now = rp.components([[values[arm][(w, s)] - values[base][(w, s)] for s in SEEDS]
                                 for w in WARM_STARTS[task]])
            then = rp.components(rp.differences(headline, arm, base, stale_rerun.WARM_STARTS, stale_rerun.SEEDS))
            alpha = ALPHA / family_sizes()[name]
            variances = [c.mean_variance(seeds, upper) for c in (now, then) for upper in (False, True)]
            out[(task, name)] = {"now": now, "se": math.sqrt(variances[0] / starts),
                                 "t": [rp.power_t(MARGIN, v, starts, alpha) for v in variances],
                                 "tost": [rp.power_tost(0.0, v, starts, MARGIN, alpha) for v in variances]}
    return out


def power_block(power: dict, missing_by_task: dict) -> str:
    """Markdown of :func:`achieved_power`: the power the registered design had, from the replication's own
    variance components (not from its observed differences), beside the power planned from the rerun's."""
    import replication_power as rp

    out = ["| task | H | SD warm start (95% upper) | SD seed (95% upper) | SE of the mean | t power at "
           f"+-{MARGIN:g}: achieved (upper) | planned (upper) | TOST power at 0: achieved (upper) | planned (upper) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for task in TASKS:
        if missing_by_task[task]:
            out.append(f"| {task} | pending: {missing_by_task[task]} of the 72 runs not in | | | | | | | |")
            continue
        for name, _, _ in COMPARISONS:
            r = power[(task, name)]
            c = r["now"]
            cells = [f"{r[k][i]:.2f} ({r[k][i + 1]:.2f})" for k in ("t", "tost") for i in (0, 2)]
            out.append(f"| {task} | {name} | {rp._sd(c.var_ws)} ({rp._sd(c.var_ws_upper)}) | "
                       f"{rp._sd(c.var_seed)} ({rp._sd(c.var_seed_upper)}) | {r['se']:.4f} | " + " | ".join(cells)
                       + " |")
    out.append("\nAchieved: from this replication's paired differences (the one-way random-effects ANOVA of "
               "`sweeps/replication_power.py`, 12 warm starts x 2 seeds); planned: from the rerun's, as the "
               "pre-registration printed them. Power of the registered two-sided t over the 12 warm-start means at "
               "alpha / (Holm family size) for a true difference of the margin, and of TOST (on par within the "
               "margin) for a true difference of 0; in brackets with both variance components at their one-sided 95% "
               "upper bounds. A power computed from the observed difference is not given: it adds nothing to p.")
    return "\n".join(out)


def readme_block(tests: list[WarmStartTest], rerun: list, missing_by_task: dict, power: dict) -> str:
    """Markdown for the README and the page's top: each comparison's claim at each unit, with its test, n, interval
    and p: the rerun with the run as the unit (its registered test) and with the warm start as the unit (post hoc),
    beside the replication (the warm start as the unit, as registered); then the recommendation, by the rerun's
    rule (``stale_rerun.recommendation_table``) applied to the replication's readings, pending until both tasks'
    rows are in."""
    old = {(r.task, r.name): r for r in rerun}
    new = {(t.task, t.name): t for t in tests}
    out = ["| task | H | the rerun, the run as the unit (15 pairs; bootstrap interval, paired t, registered) | the rerun, "
           "the warm start as the unit (3 means; t interval and p, df 2, post hoc) | the replication, the warm start "
           "as the unit (12 fresh; t interval and p, df 11, registered) | reading cited |", "|---|---|---|---|---|---|"]
    for task in TASKS:
        for name, arm, base in COMPARISONS:
            r = old.get((task, name))
            then = (f"{r.paired.diff:+.3f} {stale_rerun._ci(r.paired)}, p {_p(r.paired.p)} (Holm {_p(r.holm_p)}), "
                    f"TOST p {_p(r.paired.tost_p)}: {r.verdict}" if r else "-")
            means = list(r.per_start.values()) if r else []
            then_ws = (f"{stats.mean_se(means)[0]:+.3f} {_ci(stats.t_interval(means, 0.95))}, p {_p(r.p_warm_starts)}; "
                       f"{sum(d > 0 for d in means)} of {len(means)} warm starts > 0" if r else "-")
            t = new.get((task, name))
            if t is None:
                now, reading = f"pending ({missing_by_task[task]} of 72 runs not in)", "pending"
            else:
                now = (f"{t.diff:+.3f} {_ci(t.ci95)}, p {_p(t.p)} (Holm {_p(t.holm_p)}); TOST p (Holm) "
                       f"{_p(t.holm_tost_p)}; {t.positive} of {len(t.means)} warm starts > 0")
                reading = "pending (Holm reads both tasks)" if t.verdict == "pending" else f"**{t.verdict}**"
            out.append(f"| {task} | {name} `{arm}` - `{base}` | {then} | {then_ws} | {now} | {reading} |")
    out.append("")
    by = {k: t.verdict for k, t in new.items()}
    if len({t for t, _ in by}) < len(TASKS) or "pending" in by.values():
        out.append("The recommendation (the rerun's rule on the replication's readings) is pending until both tasks' "
                   "replication rows are in; until then no stale-samples setting is recommended. ")
    else:
        out.append(stale_rerun.recommendation_table(by, "the replication") + "\n\n")
    out[-1] += ("Test mean@16 on 1024 prompts; each difference with its 95% interval and two-sided p. The rerun's "
                "reading (its registered rule): on par = TOST p < 0.05 at +-0.02, uncorrected, read first; else "
                "better/worse = Holm p < 0.05 over its 6 tests. The replication's: on par = Holm-adjusted TOST p < "
                "0.05, read first (a difference can be both significant and inside the margin: it reads on par); "
                "else better/worse = Holm-adjusted p < 0.05 (families: H2 on both tasks; H1 and H3 on both tasks). "
                "The reading cited is the replication's, as registered; the rerun's stays as it was. The power "
                f"the design had for H2 (primary) at +-{MARGIN:g}, from the replication's own variance components "
                "(t test at the margin; TOST at 0): " + "; ".join(
                    f"{t}: " + (f"t {power[(t, 'H2')]['t'][0]:.2f}, TOST {power[(t, 'H2')]['tost'][0]:.2f}"
                                if (t, "H2") in power else "pending") for t in TASKS) + ".")
    return "\n".join(out)


def rerun_results(results_dir: Path) -> list:
    """The rerun's comparisons (``sweeps/stale_rerun.py``'s ``Result``: paired test, Holm, reading)."""
    values, missing = {}, {}
    for t in TASKS:
        path = results_dir / f"stale_headline_{t}.csv"
        values[t], missing[t] = stale_rerun.headline_values(stale_rerun.read_rows(path, stale_rerun.HEADLINE_KEY),
                                                            where=str(path))
    return stale_rerun.compare_tasks({t: values[t] for t in TASKS if not missing[t]})


def rerun_verdicts(results_dir: Path) -> dict:
    """The rerun's registered readings, by (task, comparison)."""
    return {(r.task, r.name): r.verdict for r in rerun_results(results_dir)}


def blocks(results_dir: Path = RESULTS) -> dict[str, str]:
    """Every generated block of the replication, by name, from the CSVs under ``results_dir``."""
    if not results_dir.is_dir():
        raise ValueError(f"{results_dir}: no such folder (the rows live in sweeps/results/)")
    cells, chosen, edge_missing = edge_step(*_edge_inputs(results_dir))
    lrs = {t: dict(STAGE1_LR[t]) for t in TASKS}
    lrs[EDGE_TASK] = dict(chosen)
    values, missing = {}, {}
    for t in TASKS:
        path = results_dir / f"replication_{t}.csv"
        values[t], missing[t] = read_replication(stale_rerun.read_rows(path, KEY), t, lrs[t], str(path))
    complete = {t: values[t] for t in TASKS if not missing[t]}
    tests = analyse(complete)
    power = achieved_power(values, missing, results_dir)
    return {"edge": edge_block(cells, chosen, edge_missing), "results": results_block(values, missing, tests),
            "conclusions": conclusions_block(tests, rerun_verdicts(results_dir)),
            "readouts": readouts_block(missing, readouts(complete, tests)),
            "readme": readme_block(tests, rerun_results(results_dir), missing, power),
            "power": power_block(power, missing)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=RESULTS, help="the folder of the CSVs (default sweeps/results)")
    p.add_argument("--tuned-lr", choices=TASKS, help="print the tuned_lr overrides of this task's replication runs")
    args = p.parse_args(argv)
    try:
        if args.tuned_lr:
            lrs = registered_lrs(args.results)[args.tuned_lr]
            if any(lr is None for lr in lrs.values()):
                print(f"pending: the edge step's rows are not all in (sweeps/results/replication_edge_{EDGE_TASK}.csv);"
                      f" the replication's {args.tuned_lr} runs wait for them", file=sys.stderr)
                return 1
            print(" ".join(f"tuned_lr.{arm}={lr:g}" for arm, lr in lrs.items()))
            return 0
        generated = blocks(args.results)
    except ValueError as err:
        p.error(str(err))
    for name, text in generated.items():
        print(f"## {name}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
