"""The refresh-rule screen (planned in docs/results/refresh_rules.md before any of its runs): stage 1 chooses each
rule's threshold on validation, stage 2 compares k10_ppo with each chosen rule against k10_ppo alone on test, the
warm start as the unit. Every block of the page is generated from the rows (``sweeps/doc_tables.py``); a block
whose rows are not all in says "pending" with its count.

    python sweeps/refresh_screen.py                    # print every block
    python sweeps/refresh_screen.py --arms default     # stage 2's correction_arm= for a task (refused before stage 1)

Inputs, under ``sweeps/results/`` (``sweep_status.py --csv``):

- ``refresh_screen_tune_<task>.csv``: stage 1, one row per (arm, seed): the six threshold arms
  ``k10_ppo_drift{02,05,10}`` and ``k10_ppo_ess{80,90,97}`` at seeds 100, 101, ``val_mean_at_16``;
- ``refresh_screen_tune_edge_<task>.csv``: stage 1's edge step, the same for ``k10_ppo_drift01`` and
  ``k10_ppo_ess99`` (one tighter threshold per rule, added to the plan before its runs);
- ``refresh_screen_test_<task>.csv``: stage 2, one row per (arm, ``model.warmstart.seed``, seed): k10_ppo and the
  two chosen arms at warm starts 0-2 x seeds 0, 1, ``test_mean_at_16``, ``drift_refreshes``, ``ess_refreshes``,
  ``train_entropy_end``.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "sweeps"))

import stale_rerun  # noqa: E402

from grpolab.report import stats  # noqa: E402

RESULTS = ROOT / "sweeps" / "results"
TASKS = ("default", "multistep")
BASE = "k10_ppo"
GRID = {"drift": ("k10_ppo_drift02", "k10_ppo_drift05", "k10_ppo_drift10"),
        "ess": ("k10_ppo_ess80", "k10_ppo_ess90", "k10_ppo_ess97")}
# the edge step, added to the plan before its runs (default's choices sat at the tightest threshold of both grids):
# one tighter threshold per rule, on both tasks, in its own sweep (sweeps/refresh_screen_tune_edge.yaml)
EDGE = {"drift": ("k10_ppo_drift01",), "ess": ("k10_ppo_ess99",)}
RULES = {"drift": EDGE["drift"] + GRID["drift"], "ess": GRID["ess"] + EDGE["ess"]}  # the extended grid, by threshold
TUNE_SEEDS = (100, 101)
STAGE1 = sum(map(len, RULES.values())) * len(TUNE_SEEDS)  # 16 runs per task: 8 arms x the 2 tuning seeds
WARM_STARTS, SEEDS = (0, 1, 2), (0, 1)
ALPHA, DETECTABLE = 0.05, 0.05  # the plan's detectable effect: a difference inside it is "not distinguishable"
TUNE_KEY, TEST_KEY = ("arm", "seed"), ("arm", "model.warmstart.seed", "seed")


def threshold(arm: str) -> tuple[str, float]:
    """The rule's key and threshold of a screen arm, read from ``sweeps/correction_arm/<arm>.yaml``
    (``rollout.refresh.<rule>.max_drift`` or ``.min_ess``)."""
    node = yaml.safe_load((ROOT / "sweeps" / "correction_arm" / f"{arm}.yaml").read_text())["rollout"]["refresh"]
    rule = "drift" if "drift" in node else "ess"
    key = "max_drift" if rule == "drift" else "min_ess"
    return key, float(node[rule][key])


def looseness(arm: str) -> float:
    """Higher = fewer refreshes: a larger max_drift, a smaller min_ess."""
    key, value = threshold(arm)
    return value if key == "max_drift" else -value


def choose(rows: list[dict], where: str, edge_rows: list[dict] = (), edge_where: str = "edge") -> tuple[dict, dict, int]:
    """Stage 1's rule, per rule: over the extended grid (the first sweep's arms ``rows`` and the edge step's
    ``edge_rows``), the threshold arm with the highest mean ``val_mean_at_16`` over the tuning seeds; a tie goes to
    the looser threshold (fewer refreshes); a non-finite score counts 0.

    Returns:
        (cells, chosen, missing): cells[arm] = (mean, SE, n, the rule's mean refresh count a run; the count is
        descriptive, the choice reads the score only), chosen[rule] = arm or None while a cell lacks a seed,
        missing = the number of the 16 stage 1 runs not in the rows.
    Raises:
        ValueError: a row of another arm or seed than its sweep's, a duplicate (arm, seed), a row without a score.
    """
    values: dict[str, dict[int, float]] = {a: {} for group in RULES.values() for a in group}
    refreshes: dict[str, list[float]] = {a: [] for a in values}
    for part, name, grid in ((rows, where, GRID), (edge_rows, edge_where, EDGE)):
        stale_rerun.refuse_duplicate_rows(part, TUNE_KEY, name)
        arms = [a for group in grid.values() for a in group]
        for i, r in enumerate(part, start=2):
            arm, seed = r["arm"], int(float(r["seed"]))
            if arm not in arms or seed not in TUNE_SEEDS:
                raise ValueError(f"{name} line {i}: ({arm}, seed {seed}) is not in its stage 1 sweep's grid (arms "
                                 f"{', '.join(arms)}; seeds {', '.join(map(str, TUNE_SEEDS))})")
            values[arm][seed] = stale_rerun._value(r, "val_mean_at_16", f"{name} line {i}")
            rule = next(name for name, group in RULES.items() if arm in group)
            refreshes[arm].append(float(r.get(f"{rule}_refreshes") or 0))
    cells = {a: (*stats.mean_se(list(v.values())), len(v), sum(refreshes[a]) / len(v)) if v
             else (math.nan, math.nan, 0, math.nan) for a, v in values.items()}
    chosen = {}
    for rule, group in RULES.items():
        if any(cells[a][2] < len(TUNE_SEEDS) for a in group):
            chosen[rule] = None
            continue
        chosen[rule] = max(group, key=lambda a: (cells[a][0], looseness(a)))
    missing = sum(len(TUNE_SEEDS) - len(v) for v in values.values())
    return cells, chosen, missing


def stage1_of(task: str, results_dir: Path = RESULTS) -> tuple[dict, dict, int]:
    """``choose`` over a task's two stage 1 files, ``refresh_screen_tune_<task>.csv`` and
    ``refresh_screen_tune_edge_<task>.csv`` (either may be missing: its runs count as missing)."""
    path, edge = (results_dir / f"refresh_screen_tune{part}_{task}.csv" for part in ("", "_edge"))
    return choose(stale_rerun.read_rows(path, TUNE_KEY), str(path), stale_rerun.read_rows(edge, TUNE_KEY), str(edge))


@dataclass
class RuleTest:
    """One rule arm against k10_ppo on one task: the paired test-score differences per (warm start, seed)."""

    task: str
    arm: str
    pairs: dict  # (warm start, seed) -> difference
    refreshes: float  # the rule's mean refresh count over its runs
    entropy: float | None  # mean final-entropy difference, or None when the rows lack it
    base: float = math.nan  # k10_ppo's own mean test score over the 6 runs (the scale of the difference)
    holm_p: float | None = None

    @property
    def means(self) -> list[float]:
        return [sum(self.pairs[(w, s)] for s in SEEDS) / len(SEEDS) for w in WARM_STARTS]

    @property
    def diff(self) -> float:
        return stats.mean_se(self.means)[0]

    @property
    def p(self) -> float:
        return stats.one_sample_t(self.means)[2]

    @property
    def reading(self) -> str:
        """better / worse (Holm-adjusted p < 0.05 over the 4 warm-start tests, by the sign), else "not
        distinguishable at this size" (never "equal"); "pending" before Holm."""
        if self.holm_p is None:
            return "pending"
        if self.holm_p < ALPHA:
            return "better" if self.diff > 0 else "worse"
        return f"not distinguishable at this size (the screen shows about {DETECTABLE:g} or more)"


def compare(rows: list[dict], task: str, chosen: dict, where: str) -> tuple[list[RuleTest], int]:
    """Stage 2's comparisons of one task: (tests, missing), tests empty while any of the 18 runs is missing.

    Raises:
        ValueError: a row of an arm stage 1 did not choose (nothing is added after looking), of another warm start
            or seed, a duplicate key, a row without a score.
    """
    stale_rerun.refuse_duplicate_rows(rows, TEST_KEY, where)
    arms = [BASE, *(a for a in chosen.values() if a)]
    got: dict[str, dict] = {a: {} for a in arms}
    for i, r in enumerate(rows, start=2):
        arm, w, s = r["arm"], int(float(r["model.warmstart.seed"])), int(float(r["seed"]))
        if arm not in got or w not in WARM_STARTS or s not in SEEDS:
            raise ValueError(f"{where} line {i}: ({arm}, warm start {w}, seed {s}) is not in stage 2's grid (arms "
                             f"{', '.join(arms)}: k10_ppo and stage 1's choices; warm starts 0-2; seeds 0, 1)")
        got[arm][(w, s)] = r
    grid = [(w, s) for w in WARM_STARTS for s in SEEDS]
    missing = (len(chosen) + 1) * len(grid) - sum(len(v) for v in got.values())
    if missing or any(a is None for a in chosen.values()):
        return [], missing
    tests = []
    for rule, arm in chosen.items():
        def score(a, k, column="test_mean_at_16"):
            return stale_rerun._value(got[a][k], column, f"{where} ({a}, warm start {k[0]}, seed {k[1]})")

        pairs = {k: score(arm, k) - score(BASE, k) for k in grid}
        count = f"{rule}_refreshes"
        refreshes = sum(float(got[arm][k].get(count) or 0) for k in grid) / len(grid)
        has_entropy = all(got[a][k].get("train_entropy_end") not in (None, "") for a in (arm, BASE) for k in grid)
        entropy = (sum(score(arm, k, "train_entropy_end") - score(BASE, k, "train_entropy_end") for k in grid)
                   / len(grid)) if has_entropy else None
        base = sum(score(BASE, k) for k in grid) / len(grid)
        tests.append(RuleTest(task, arm, pairs, refreshes, entropy, base))
    return tests, 0


def holm(tests: list[RuleTest]) -> None:
    """Holm over the 4 warm-start p-values (2 rules x 2 tasks), in place; only once both tasks are in."""
    from statsmodels.stats.multitest import multipletests

    if len({t.task for t in tests}) < len(TASKS):
        return
    for t, p in zip(tests, multipletests([t.p for t in tests], alpha=ALPHA, method="holm")[1]):
        t.holm_p = float(p)


def _p(p: float | None) -> str:
    return stale_rerun._p(p)


def tune_block(stage1: dict) -> str:
    """Markdown: per task, each threshold's validation score and the chosen one per rule."""
    out = []
    for task, (cells, chosen, missing) in stage1.items():
        state = f"all {STAGE1} runs in" if not missing else f"pending: {missing} of the {STAGE1} runs not in"
        out += [f"**{task}** (val mean@16, 1024 prompts, warm start 3, seeds 100, 101; {state})\n",
                "| rule | threshold | mean +- SE | refreshes a run | chosen |", "|---|---|---|---|---|"]
        for rule, group in RULES.items():
            for arm in group:
                key, value = threshold(arm)
                mean, se, n, count = cells[arm]
                text = "-" if not n else f"{mean:.3f} +- {se:.3f}" + ("" if n == len(TUNE_SEEDS) else f" (n={n})")
                edge = " (edge step)" if arm in EDGE[rule] else ""
                mark = "" if chosen[rule] != arm else "**yes**" + (" (at the extended grid's edge)" if edge else "")
                out.append(f"| {rule} | `{key}={value:g}` (`{arm}`){edge} | {text} | {'-' if not n else f'{count:.0f}'} "
                           f"| {mark} |")
        out.append("")
    out.append("Rule (fixed before the runs): per rule and task, the threshold with the highest mean over the two "
               "seeds, over the extended grid (the edge step's tighter threshold included); a tie goes to the looser "
               "threshold (fewer refreshes). Refreshes a run: those the rule triggered (mean over the seeds), the "
               "every-10-steps bound's not counted. Rows: `sweeps/results/refresh_screen_tune_<task>.csv` and "
               "`sweeps/results/refresh_screen_tune_edge_<task>.csv`.")
    return "\n".join(out)


def test_block(stage2: dict, tests: list[RuleTest]) -> str:
    """Markdown: per task, each chosen rule against k10_ppo, the warm start as the unit, Holm over the 4."""
    out = ["| task | rule arm - `k10_ppo` | `k10_ppo` mean | difference (3 warm starts) | 95% CI (t, df 2) | p | p (Holm, 4) | 6 pairs: "
           "p (seed level, weaker) | warm starts > 0 | refreshes a run | final entropy diff | reading |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for task in TASKS:
        mine = [t for t in tests if t.task == task]
        if not mine:
            out.append(f"| {task} | pending: {stage2[task]} of the 18 runs not in (or stage 1 not done) "
                       "| | | | | | | | | | |")
            continue
        for t in mine:
            lo, hi = stats.t_interval(t.means, 0.95)
            seed_p = stats.one_sample_t(list(t.pairs.values()))[2]
            entropy = "-" if t.entropy is None else f"{t.entropy:+.3f}"
            out.append(f"| {task} | `{t.arm}` | {t.base:.3f} | {t.diff:+.3f} | [{lo:+.3f}, {hi:+.3f}] | {_p(t.p)} | {_p(t.holm_p)} | "
                       f"{_p(seed_p)} | {sum(m > 0 for m in t.means)} of 3 | {t.refreshes:.1f} | {entropy} | "
                       f"{t.reading} |")
    out.append("\nTest mean@16 on 1024 prompts at 1000 steps. The unit is the warm start: each warm start's mean "
               "paired difference over its 2 seeds, then the t over the 3 means (df 2); Holm over the 2 rules x 2 "
               "tasks; the seed-level paired t over the 6 pairs beside it is the weaker unit. A rule that helps on "
               "one task and hurts on the other is reported as such; no pooled claim. Rows: "
               "`sweeps/results/refresh_screen_test_<task>.csv`.")
    return "\n".join(out)


def analyse(results_dir: Path = RESULTS) -> tuple[dict, dict, list[RuleTest]]:
    """Stage 1's choices, stage 2's missing counts and the Holm-corrected tests, from the CSVs."""
    stage1, stage2, tests = {}, {}, []
    for task in TASKS:
        stage1[task] = stage1_of(task, results_dir)
        path = results_dir / f"refresh_screen_test_{task}.csv"
        mine, stage2[task] = compare(stale_rerun.read_rows(path, TEST_KEY), task, stage1[task][1], str(path))
        tests += mine
    holm(tests)
    return stage1, stage2, tests


def blocks(results_dir: Path = RESULTS) -> dict[str, str]:
    """Every generated block of the screen, by name (``tune``, ``test``)."""
    if not results_dir.is_dir():
        raise ValueError(f"{results_dir}: no such folder (the rows live in sweeps/results/)")
    stage1, stage2, tests = analyse(results_dir)
    return {"tune": tune_block(stage1), "test": test_block(stage2, tests)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=RESULTS, help="the folder of the CSVs (default sweeps/results)")
    p.add_argument("--arms", choices=TASKS, help="print stage 2's correction_arm= override for this task")
    args = p.parse_args(argv)
    try:
        if args.arms:
            _, chosen, missing = stage1_of(args.arms, args.results)
            if missing:
                print(f"pending: {missing} of stage 1's {STAGE1} runs of {args.arms} are not in {args.results} "
                      f"(refresh_screen_tune_{args.arms}.csv, refresh_screen_tune_edge_{args.arms}.csv)", file=sys.stderr)
                return 1
            print("correction_arm=" + ",".join([BASE, *chosen.values()]))
            return 0
        generated = blocks(args.results)
    except ValueError as err:
        p.error(str(err))
    for name, text in generated.items():
        print(f"## {name}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
