"""The stale-samples rerun's analysis (sweeps/stale_rerun.py) on hand-made rows whose statistics are computed here
with scipy directly, the results CSV it reads (sweeps/sweep_status.py --csv), and the generated blocks of the docs
(sweeps/doc_tables.py): every one in the repository equals what the scripts make of the checked-in rows."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO_ROOT, load_sweep_script
from scipy import stats as st

rerun = load_sweep_script("stale_rerun")
doc_tables = load_sweep_script("doc_tables")
report = sys.modules.get("report") or load_sweep_script("report")


def _tune_rows(values):
    return [{"arm": arm, "algo.learning_rate": str(lr), "seed": str(seed), "val_mean_at_16": str(v)}
            for (arm, lr, seed), v in values.items()]


def test_the_lr_rule_ties_go_low_a_non_finite_run_counts_zero_and_a_missing_seed_stops_it():
    lrs, seeds = (1e-5, 2e-5), (1, 2, 3)
    rows = _tune_rows({**{("tie", 1e-5, s): v for s, v in zip(seeds, (0.25, 0.5, 0.75))},
                       **{("tie", 2e-5, s): 0.5 for s in seeds},                      # same mean 0.5: lower lr wins
                       **{("nan", 1e-5, s): v for s, v in zip(seeds, (0.5, 0.5, "nan"))},  # (0.5+0.5+0)/3
                       **{("nan", 2e-5, s): 0.4 for s in seeds},
                       **{("short", 1e-5, s): 0.9 for s in seeds}, ("short", 2e-5, 1): 0.1})
    cells, chosen, missing = rerun.select_lr(rows, arms=("tie", "nan", "short"), lrs=lrs, seeds=seeds)
    assert chosen == {"tie": 1e-5, "nan": 2e-5, "short": None}
    assert cells[("nan", 1e-5)][0] == pytest.approx(1 / 3) and cells[("nan", 1e-5)][2] == 3
    assert cells[("tie", 1e-5)][1] == pytest.approx(np.std([0.25, 0.5, 0.75], ddof=1) / math.sqrt(3))
    assert missing == 2 and cells[("short", 2e-5)][2] == 1
    with pytest.raises(ValueError, match=r"line 2: no number in column 'val_mean_at_16' \(got ''\)"):
        rerun.select_lr([{**rows[0], "val_mean_at_16": ""}], arms=("tie",), lrs=lrs, seeds=seeds)
    rows.append({"arm": "tie", "algo.learning_rate": "1e-05", "seed": "1", "val_mean_at_16": "0.3"})
    with pytest.raises(ValueError, match=r"duplicate \(arm=tie, algo.learning_rate=1e-05, seed=1\): line 2 and line 18"):
        rerun.select_lr(rows, arms=("tie",), lrs=lrs, seeds=seeds)


def test_a_duplicate_row_is_refused_by_key_and_lines_even_with_the_same_score(tmp_path):
    """Issue 39 (item 12): stage 2 kept the last of two rows of one (arm, warm start, seed) without a word, and
    stage 1 accepted two rows with the same score; the analysis refuses both, naming the key and the rows."""
    rows = _headline_rows(0.05, 0.0, {(w, s): 0.0 for w in rerun.WARM_STARTS for s in rerun.SEEDS})
    again = {**rows[0], "test_mean_at_16": "0.9"}  # onpolicy, warm start 0, seed 0: a rerun kept beside
    with pytest.raises(ValueError, match=r"^stale_headline rows: duplicate \(arm=onpolicy, model.warmstart.seed=0, "
                                         r"seed=0\): line 2 and line 47$"):
        rerun.headline_values([*rows, again])
    tune = _tune_rows({("a", lr, s): 0.5 for lr in rerun.LRS for s in rerun.TUNE_SEEDS})
    with pytest.raises(ValueError, match=r"duplicate \(arm=a, algo.learning_rate=5e-05, seed=101\): line 6 and line 11"):
        rerun.select_lr([*tune, dict(tune[4])], arms=("a",))
    (tmp_path / "stale_headline_default.csv").write_text(
        "arm,model.warmstart.seed,seed,test_mean_at_16\n" + "".join(
            f"{r['arm']},{r['model.warmstart.seed']},{r['seed']},{r['test_mean_at_16']}\n" for r in [*rows, again]))
    res = subprocess.run([sys.executable, "sweeps/stale_rerun.py", "--results", str(tmp_path)], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().splitlines()[-1].endswith(
        f"{tmp_path / 'stale_headline_default.csv'}: duplicate (arm=onpolicy, model.warmstart.seed=0, seed=0): line 2 "
        "and line 47")


def test_the_stage1_table_names_the_arms_chosen_at_either_edge_of_the_grid():
    lrs, seeds = rerun.LRS, rerun.TUNE_SEEDS
    best = {arm: lrs[i % len(lrs)] for i, arm in enumerate(rerun.TUNE_ARMS)}  # bottom, middle, top, bottom, ...
    rows = _tune_rows({(arm, lr, s): (0.6 if lr == best[arm] else 0.5) for arm in rerun.TUNE_ARMS for lr in lrs
                       for s in seeds})
    block = rerun.stage1_block({"t": rerun.select_lr(rows, arms=rerun.TUNE_ARMS, lrs=lrs, seeds=seeds)})
    names = lambda lr: ", ".join(f"`{a}`" for a in rerun.TUNE_ARMS if best[a] == lr)  # noqa: E731
    assert f"At the top of the grid ({max(lrs):g}, no higher lr tried): {names(max(lrs))}." in block
    assert f"At the bottom of the grid ({min(lrs):g}, no lower lr tried): {names(min(lrs))}." in block
    middle = [a for a in rerun.TUNE_ARMS if best[a] not in (min(lrs), max(lrs))]
    assert middle and not any(f"`{a}`" in line for a in middle for line in block.splitlines() if "grid (" in line)


def _headline_rows(shift_async, shift_window, noise):
    """45 rows per arm set: onpolicy at a base per (warm start, seed), grpo_async = onpolicy + shift_async + e,
    onpolicy_prev_window = grpo_async + shift_window + e/10 (e = noise[(warm start, seed)]); so the paired
    differences are H1 = shift_async + e, H2 = shift_window + e/10, H3 = shift_async + shift_window + 1.1 e."""
    rows = []
    for w in rerun.WARM_STARTS:
        for s in rerun.SEEDS:
            base = 0.4 + 0.01 * s + 0.02 * w
            e = noise[(w, s)]
            values = {"onpolicy": base, "grpo_async": base + shift_async + e,
                      "onpolicy_prev_window": base + shift_async + e + shift_window + e / 10}
            rows += [{"arm": a, "model.warmstart.seed": str(w), "seed": str(s), "test_mean_at_16": repr(v)}
                     for a, v in values.items()]
    return rows


def test_the_headline_comparisons_by_hand():
    rng = np.random.default_rng(0)
    noise = {(w, s): float(rng.normal(0, 0.004)) for w in rerun.WARM_STARTS for s in rerun.SEEDS}
    values = {}
    for task, (shift_async, shift_window) in {"default": (0.05, 0.0005), "multistep": (0.002, -0.06)}.items():
        values[task], missing = rerun.headline_values(_headline_rows(shift_async, shift_window, noise))
        assert missing == 0
    results = rerun.compare_tasks(values)
    assert [(r.task, r.name) for r in results] == [(t, h) for t in rerun.TASKS for h in ("H1", "H2", "H3")]
    raw = []
    for r in results:
        a, b = values[r.task][r.arm], values[r.task][r.base]
        keys = sorted(a)
        d = np.array([a[k] - b[k] for k in keys])
        assert r.paired.diff == pytest.approx(d.mean()) and r.paired.se == pytest.approx(d.std(ddof=1) / math.sqrt(15))
        assert r.paired.p == pytest.approx(st.ttest_rel([a[k] for k in keys], [b[k] for k in keys]).pvalue)
        assert r.paired.ci[0] < r.paired.diff < r.paired.ci[1]
        for w in rerun.WARM_STARTS:
            assert r.per_start[w] == pytest.approx(np.mean([a[(w, s)] - b[(w, s)] for s in rerun.SEEDS]))
        assert r.p_warm_starts == pytest.approx(st.ttest_1samp(list(r.per_start.values()), 0).pvalue)
        raw.append(r.paired.p)
    order = np.argsort(raw)  # Holm by hand: the i-th smallest p times (6 - i), kept monotone, capped at 1
    holm, running = np.empty(6), 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (6 - i) * raw[j]))
        holm[j] = running
    assert [r.holm_p for r in results] == pytest.approx(list(holm))
    by = {(r.task, r.name): r for r in results}
    assert by[("default", "H1")].verdict == "better" and by[("default", "H2")].verdict == "on par"
    assert by[("default", "H3")].verdict == "better" and by[("default", "H3")].robust
    assert by[("multistep", "H1")].verdict == "on par" and by[("multistep", "H2")].verdict == "worse"
    text = rerun.conclusions_block(results)
    assert "(H2 on par and H3 better, both tasks): **does not hold**" in text
    assert "(H2 worse on a task): **holds on multistep**" in text
    assert "(H1 on par), multistep: **holds**" in text and "(H1 on par), default: **does not hold**" in text
    advice = rerun.recommendation_block(results)
    assert "| asynchronous generation (lag 1) | `algo=grpo_async`: at or above on-policy GRPO (default better, " \
           "multistep on par) |" in advice
    assert "| on-policy training | plain on-policy GRPO: the window costs accuracy on multistep |" in advice
    for r in results:  # the firmness line under it: H1 and H3 only, the warm start as the unit, signs by hand
        same = len({d > 0 for d in r.per_start.values()}) == 1
        said = f"{r.task} {r.name} p = {rerun._p(r.p_warm_starts)}, " + (
            "the same sign on every warm start" if same else "signs that differ between warm starts")
        assert (said in advice) == (r.name != "H2"), said
    assert "signs that differ" in advice  # multistep H1: a 0.002 shift in 0.004 noise
    table = rerun.headline_block(values, {t: 0 for t in rerun.TASKS}, results)
    h1 = by[("default", "H1")]
    assert f"| H1 | `grpo_async` - `onpolicy` | {h1.paired.diff:+.3f} +- {h1.paired.se:.3f} |" in table


def test_h2_better_is_said_apart_from_the_registered_conclusions():
    noise = {(w, s): 0.001 * (s - 2) + 0.0005 * w for w in rerun.WARM_STARTS for s in rerun.SEEDS}
    values = {t: rerun.headline_values(_headline_rows(0.03, shift, noise))[0]
              for t, shift in (("default", 0.04), ("multistep", 0.0))}
    text = rerun.conclusions_block(rerun.compare_tasks(values))
    assert "**does not hold** (H1 better).\n\nNot pre-registered (no registered conclusion reads it): H2 better on " \
           "default:" in text
    assert "(H2 worse on a task): **does not hold**" in text
    values["default"] = values["multistep"]
    assert "Not pre-registered" not in rerun.conclusions_block(rerun.compare_tasks(values))


def test_one_task_in_draws_no_holm_and_no_conclusion():
    noise = {(w, s): 0.001 * (s - 2) for w in rerun.WARM_STARTS for s in rerun.SEEDS}
    values, _ = rerun.headline_values(_headline_rows(0.05, 0.0, noise))
    results = rerun.compare_tasks({"default": values})
    assert all(r.holm_p is None for r in results) and results[0].verdict == "pending"
    assert rerun.conclusions_block(results).startswith("Pending")
    assert rerun.recommendation_block(results).startswith("Pending")
    part, missing = rerun.headline_values(_headline_rows(0.05, 0.0, noise)[:-4])
    assert missing == 4
    assert "**default**: pending, 4 of the 45 runs" in rerun.headline_block({"default": part, "multistep": {}},
                                                                            {"default": 4, "multistep": 45}, [])


def test_sweep_status_keeps_the_grids_other_keys_and_the_report_names_arms_by_them(tmp_path, capsys):
    sweep, out = tmp_path / "sweep", tmp_path / "tune.csv"
    for i, (lr, seed, score) in enumerate([("5e-05", 100, 0.5), ("0.0001", 100, 0.75), ("5e-05", 101, 0.25),
                                           ("0.0001", 101, 0.5)]):
        job = sweep / str(i)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(
            f"- seed={seed}\n- algo.learning_rate={lr}\n- correction_arm=onpolicy\n")
        (job / "summary.json").write_text(json.dumps({"seed": seed, "steps": 10, "val_mean_at_16": score,
                                                      "val_mean_at_16_se": 0.01, "val_accuracy_start": 0.3}))
    cmd = [sys.executable, "sweeps/sweep_status.py", str(sweep), "--csv", str(out), "correction_arm=onpolicy",
           "algo.learning_rate=5e-05,0.0001", "seed=100,101"]
    for added in (4, 0):
        res = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
        assert f"{added} rows added to {out}" in res
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0])[:3] == ["arm", "algo.learning_rate", "seed"]
    assert sorted((r["algo.learning_rate"], r["seed"], r["val_mean_at_16"]) for r in rows) == [
        ("0.0001", "100", "0.75"), ("0.0001", "101", "0.5"), ("5e-05", "100", "0.5"), ("5e-05", "101", "0.25")]
    _, chosen, _ = rerun.select_lr(rows, arms=("onpolicy",), lrs=(5e-5, 1e-4), seeds=(100, 101))
    assert chosen == {"onpolicy": 1e-4}
    text = report.report_markdown([str(out), "--metric", "val_mean_at_16", "--vs", "algo.learning_rate=5e-05"])
    assert "| `algo.learning_rate=0.0001` | 100, 101 | 2 | 0.625 +- 0.125 | +0.250 +- 0.000 |" in text


def test_a_generated_block_is_rewritten_from_its_rows_and_a_stale_one_is_named(tmp_path):
    rows = tmp_path / "rows.csv"
    rows.write_text("arm,seed,test_mean_at_16\non,0,0.5\non,1,0.25\nasync,0,0.75\nasync,1,0.75\nother,0,0.1\n")
    doc = (f"# t\n<!-- generated by sweeps/report.py {rows} --vs on --arm async -->\n| typed | 0.9 |\n"
           "<!-- end generated -->\ntail\n")
    new, changed = doc_tables.apply(doc, doc_tables.generator())
    assert changed == [f"report.py {rows} --vs on --arm async"]
    assert "| `arm=async` | 0, 1 | 2 | 0.750 +- 0.000 | +0.375 +- 0.125 |" in new and "typed" not in new
    assert "other" not in new and new.endswith("<!-- end generated -->\ntail\n")
    assert doc_tables.apply(new, doc_tables.generator()) == (new, [])
    with pytest.raises(KeyError, match="stale_rerun.py: nope is marked but not generated"):
        doc_tables.apply("<!-- generated by sweeps/stale_rerun.py: nope -->\n<!-- end generated -->\n",
                         doc_tables.generator())


def test_every_generated_block_of_the_docs_is_what_the_scripts_make_of_the_checked_in_rows():
    res = subprocess.run([sys.executable, "sweeps/doc_tables.py", "--check"], cwd=REPO_ROOT, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "generated blocks are up to date" in res.stdout


def test_arm_keeps_every_arm_a_value_names_and_names_a_value_that_names_none(tmp_path, capsys):
    rows = tmp_path / "rows.csv"
    rows.write_text("arm,algo.learning_rate,seed,val_mean_at_16\n"
                    + "".join(f"{a},{lr},{s},0.5\n" for a in ("on", "async") for lr in ("1e-4", "5e-5") for s in (0, 1)))
    text = report.report_markdown([str(rows), "--metric", "val_mean_at_16", "--arm", "on"])
    assert "`arm=on algo.learning_rate=1e-4`" in text and "`arm=on algo.learning_rate=5e-5`" in text
    assert "async" not in text
    with pytest.raises(SystemExit):
        report.report_markdown([str(rows), "--arm", "nope"])
    assert "--arm 'nope' matches no arm; the arms are: arm=async" in capsys.readouterr().err


def test_the_rerun_names_a_missing_column_a_missing_folder_and_a_marker_without_its_end(tmp_path):
    (tmp_path / "stale_tune_default.csv").write_text("arm,seed,val_mean_at_16\non,1,0.5\n")
    with pytest.raises(ValueError, match=r"stale_tune_default.csv: no algo.learning_rate column"):
        rerun.blocks(tmp_path)
    with pytest.raises(ValueError, match="no such folder"):
        rerun.blocks(tmp_path / "nope")
    doc = "<!-- generated by sweeps/stale_rerun.py: stage1 -->\n"
    assert doc_tables.BLOCK.findall(doc) == [] and doc.count(doc_tables.START) == 1  # what --check refuses


def test_sweep_status_names_an_unknown_config_and_a_grid_without_values(tmp_path):
    for args, want in [(["--config", "nosuch"], "--config nosuch: no sweeps/nosuch.yaml (the sweep configs: async"),
                       (["seed"], "seed: a grid is given as key=a,b")]:
        res = subprocess.run([sys.executable, "sweeps/sweep_status.py", str(tmp_path), *args], cwd=REPO_ROOT,
                             capture_output=True, text=True)
        assert res.returncode == 2 and want in res.stderr, res.stderr[-2000:]
