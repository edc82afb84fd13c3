"""The refresh-rule screen's analysis (sweeps/refresh_screen.py, planned in docs/results/refresh_rules.md): stage 1's
threshold choice on validation, stage 2's paired test with the warm start as the unit, Holm over the four, and the
blocks pending until their rows are in. Rows are written here as sweep_status.py writes them."""

from __future__ import annotations

import csv
import sys

import numpy as np
import pytest
import scipy.stats as st
from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "sweeps"))
import refresh_screen as rs  # noqa: E402


def _write(path, rows):
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)


def _tune_rows(scores):
    """Stage 1 rows: scores[arm] = (seed 100, seed 101)."""
    return [{"arm": arm, "seed": str(seed), "val_mean_at_16": repr(v),
             "drift_refreshes": str(seed - 90) if "drift" in arm else "0",  # 10 and 11: the mean a run is 10.5
             "ess_refreshes": str(seed - 70) if "ess" in arm else ""}
            for arm, pair in scores.items() for seed, v in zip(rs.TUNE_SEEDS, pair)]


def _test_rows(chosen, shifts, seed=0):
    """Stage 2 rows: k10_ppo = 0.5 + warm-start and seed noise; a rule arm = k10_ppo + its shift + noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for w in rs.WARM_STARTS:
        base_w = 0.5 + rng.normal(0, 0.02)
        for s in rs.SEEDS:
            base = base_w + rng.normal(0, 0.01)
            for rule, arm in [("none", rs.BASE), *chosen.items()]:
                v = base if arm == rs.BASE else base + shifts[rule] + rng.normal(0, 0.005)
                rows.append({"arm": arm, "model.warmstart.seed": str(w), "seed": str(s), "test_mean_at_16": repr(v),
                             "drift_refreshes": "12" if rule == "drift" else "0",
                             "ess_refreshes": "30" if rule == "ess" else "", "train_entropy_end": repr(0.3 - v)})
    return rows


def _split(rows):
    """Stage 1 rows as its two sweeps write them: (the first grid's, the edge step's)."""
    edge = {a for group in rs.EDGE.values() for a in group}
    return [r for r in rows if r["arm"] not in edge], [r for r in rows if r["arm"] in edge]


def test_stage_1_chooses_the_best_threshold_over_the_extended_grid_a_tie_to_the_looser_and_waits(tmp_path):
    assert rs.threshold("k10_ppo_drift05") == ("max_drift", 0.05)  # read from the arm's yaml
    assert rs.threshold("k10_ppo_ess97") == ("min_ess", 0.97)
    assert rs.threshold("k10_ppo_drift01") == ("max_drift", 0.01) and rs.threshold("k10_ppo_ess99") == ("min_ess", 0.99)
    # exact ties in binary (a tie is an exact one): drift 0.05 and 0.1 at 0.5625, ess 0.9 and 0.97 at 0.375
    scores = {"k10_ppo_drift01": (0.5, 0.5), "k10_ppo_drift02": (0.50, 0.52), "k10_ppo_drift05": (0.5, 0.625),
              "k10_ppo_drift10": (0.625, 0.5), "k10_ppo_ess80": (0.25, 0.25), "k10_ppo_ess90": (0.25, 0.5),
              "k10_ppo_ess97": (0.375, 0.375), "k10_ppo_ess99": (0.25, 0.375)}
    first, edge = _split(_tune_rows(scores))
    cells, chosen, missing = rs.choose(first, "tune", edge, "edge")
    # each tie goes to the looser threshold (fewer refreshes): max_drift 0.1, min_ess 0.9
    assert missing == 0 and chosen == {"drift": "k10_ppo_drift10", "ess": "k10_ppo_ess90"}
    assert cells["k10_ppo_drift02"][:2] == pytest.approx((0.51, 0.01))
    # the refreshes each rule triggered, its own column (descriptive: the choice reads the score only)
    assert cells["k10_ppo_drift02"][3] == 10.5 and cells["k10_ppo_ess97"][3] == 30.5
    # the edge step's tighter threshold wins when it scores higher: it is part of the grid the rule chooses over
    first_hi, edge_hi = _split(_tune_rows({**scores, "k10_ppo_drift01": (0.75, 0.75)}))
    assert rs.choose(first_hi, "tune", edge_hi, "edge")[1]["drift"] == "k10_ppo_drift01"
    # without the edge step's rows nothing is chosen yet: 4 of the 16 runs are missing
    _, chosen, missing = rs.choose(first, "tune")
    assert missing == 4 and chosen == {"drift": None, "ess": None}
    _, chosen, missing = rs.choose(first, "tune", edge[:-1], "edge")
    assert missing == 1 and chosen == {"drift": "k10_ppo_drift10", "ess": None}
    with pytest.raises(ValueError, match=r"tune line 2: \(k10_ppo, seed 100\) is not in its stage 1 sweep's grid"):
        rs.choose(_tune_rows({"k10_ppo": (0.5, 0.5)}), "tune")
    with pytest.raises(ValueError, match=r"edge line 2: \(k10_ppo_drift02, seed 100\) is not in its stage 1 sweep"):
        rs.choose(first, "tune", first, "edge")  # each sweep's rows are checked against its own grid
    with pytest.raises(ValueError, match="duplicate"):
        rs.choose(first * 2, "tune", edge, "edge")
    results = tmp_path / "results"
    results.mkdir()
    _write(results / "refresh_screen_tune_default.csv", first)
    assert rs.main(["--results", str(results), "--arms", "default"]) == 1  # the edge step's rows not in yet
    _write(results / "refresh_screen_tune_edge_default.csv", edge)
    assert rs.main(["--results", str(results), "--arms", "default"]) == 0
    assert rs.main(["--results", str(results), "--arms", "multistep"]) == 1  # no stage 1 rows yet
    assert "all 16 runs in" in rs.blocks(results)["tune"]
    assert "| `max_drift=0.1` (`k10_ppo_drift10`) | 0.562 +- 0.062 | 10 | **yes** |" in rs.blocks(results)["tune"]
    _write(results / "refresh_screen_tune_edge_default.csv", edge_hi)  # a choice at the new edge says so
    assert "| **yes** (at the extended grid's edge) |" in rs.blocks(results)["tune"]


def test_stage_2_the_warm_start_as_the_unit_by_hand_and_holm_over_the_four(tmp_path, capsys):
    chosen = {"drift": "k10_ppo_drift05", "ess": "k10_ppo_ess90"}
    shifts = {"default": {"drift": 0.06, "ess": 0.0}, "multistep": {"drift": -0.06, "ess": 0.002}}
    tune = {a: (0.6, 0.6) if a in chosen.values() else (0.5, 0.5) for group in rs.RULES.values() for a in group}
    results = tmp_path / "results"
    results.mkdir()
    rows = {}
    for i, task in enumerate(rs.TASKS):
        first, edge = _split(_tune_rows(tune))
        _write(results / f"refresh_screen_tune_{task}.csv", first)
        _write(results / f"refresh_screen_tune_edge_{task}.csv", edge)
        rows[task] = _test_rows(chosen, shifts[task], seed=i)
        _write(results / f"refresh_screen_test_{task}.csv", rows[task][:-1])
    stage1, stage2, tests = rs.analyse(results)
    assert stage2 == {"default": 1, "multistep": 1} and tests == []
    assert "pending: 1 of the 18 runs not in" in rs.blocks(results)["test"]
    for task in rs.TASKS:
        _write(results / f"refresh_screen_test_{task}.csv", rows[task])
    _, _, tests = rs.analyse(results)
    assert [(t.task, t.arm) for t in tests] == [(task, arm) for task in rs.TASKS for arm in chosen.values()]
    raw = []
    for t in tests:  # by hand: the t over the 3 warm-start means of the paired differences
        score = {(r["arm"], int(r["model.warmstart.seed"]), int(r["seed"])): float(r["test_mean_at_16"])
                 for r in rows[t.task]}
        means = [np.mean([score[(t.arm, w, s)] - score[(rs.BASE, w, s)] for s in rs.SEEDS]) for w in rs.WARM_STARTS]
        assert t.diff == pytest.approx(np.mean(means)) and t.p == pytest.approx(st.ttest_1samp(means, 0).pvalue)
        assert t.base == pytest.approx(np.mean([score[(rs.BASE, w, s)] for w in rs.WARM_STARTS for s in rs.SEEDS]))
        assert t.entropy == pytest.approx(-np.mean([score[(t.arm, w, s)] - score[(rs.BASE, w, s)]
                                                    for w in rs.WARM_STARTS for s in rs.SEEDS]))
        raw.append(t.p)
    order, running = np.argsort(raw), 0.0  # Holm by hand over the 4
    for i, k in enumerate(order):
        running = max(running, min(1.0, (4 - i) * raw[k]))
        assert tests[k].holm_p == pytest.approx(running)
    by = {(t.task, t.arm): t for t in tests}
    assert by[("default", "k10_ppo_drift05")].refreshes == 12 and by[("default", "k10_ppo_ess90")].refreshes == 30
    assert by[("default", "k10_ppo_ess90")].reading.startswith("not distinguishable at this size")
    text = rs.blocks(results)["test"]
    d = by[("default", "k10_ppo_drift05")]
    assert f"| default | `k10_ppo_drift05` | {d.base:.3f} | {d.diff:+.3f} |" in text and f"| {d.reading} |" in text
    # a row of a threshold stage 1 did not choose is refused, naming the line: nothing is added after looking
    _write(results / "refresh_screen_test_default.csv",
           [*rows["default"], {**rows["default"][0], "arm": "k10_ppo_drift10"}])
    with pytest.raises(ValueError, match=r"line 20: \(k10_ppo_drift10, warm start 0, seed 0\) is not in stage 2"):
        rs.analyse(results)
