"""The stale-samples replication (sweeps/replication.py, pre-registered in docs/results/stale_samples.md): its
registered seeds were never used, its lrs are stage 1's, the edge step's rule, the analysis with the warm start as
the unit on synthetic rows whose tests are computed here with scipy directly, the refusals, the generated blocks
(sweeps/doc_tables.py) made from rows in a folder, and the two sweep configs."""

from __future__ import annotations

import csv
import math
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml
from conftest import REPO_ROOT, load_sweep_script
from scipy import stats as st
from test_sweeps_notebook import compose_sweep, grid

rerun = load_sweep_script("stale_rerun")
rep = load_sweep_script("replication")
doc_tables = load_sweep_script("doc_tables")
RESULTS = REPO_ROOT / "sweeps" / "results"


def test_the_registered_warm_starts_and_seeds_were_never_used_and_the_lrs_are_stage_ones():
    used = set(rep.USED_WARM_STARTS)
    for path in RESULTS.glob("*.csv"):  # every results row's warm start (a file without the column: the default, 0)
        if path.stem.startswith("replication"):  # the replication's own rows use its warm starts, by design
            continue
        rows = list(csv.DictReader(path.open()))
        used |= {int(float(r["model.warmstart.seed"])) for r in rows if r.get("model.warmstart.seed")} or {0}
    for path in (REPO_ROOT / "sweeps").glob("*.yaml"):  # every sweep config's, replication's own aside
        if path.stem.startswith("replication"):
            continue
        text = path.read_text()
        for m in re.finditer(r"warmstart\.seed:\s*([\d, ]+)|warmstart:\s*\n\s+seed:\s*(\d+)", text):
            used |= {int(v) for v in (m.group(1) or m.group(2)).split(",")}
    assert used == {0, 1, 2, 3}
    fresh = [w for t in rep.TASKS for w in rep.WARM_STARTS[t]]
    assert len(fresh) == len(set(fresh)) == 24 and not set(fresh) & used
    assert all(len(rep.WARM_STARTS[t]) == 12 for t in rep.TASKS) and len(rep.SEEDS) == 2
    assert not set(rep.SEEDS) & (set(rerun.SEEDS) | set(rerun.TUNE_SEEDS))
    for task in rep.TASKS:  # the registered lrs are what stage 1's rule chose on the checked-in rows
        _, chosen, missing = rerun.select_lr(rerun.read_rows(RESULTS / f"stale_tune_{task}.csv", rerun.TUNE_KEY))
        assert missing == 0 and {a: chosen[a] for a in rep.ARMS} == rep.STAGE1_LR[task]
    assert rep.family_sizes() == {"H2": 2, "H1": 4, "H3": 4}


def _tune(arm, lr, seed, value, start="0.2734375"):
    return {"arm": arm, "algo.learning_rate": repr(lr), "seed": str(seed), "val_mean_at_16": repr(value),
            "val_accuracy_start": start}


def test_the_edge_step_moves_an_arm_only_when_2e4_beats_its_best_and_waits_for_its_rows():
    stage1 = [_tune(a, lr, s, 0.5 + (0.1 if lr == 1e-4 else 0)) for a in rep.ARMS for lr in rerun.LRS
              for s in rerun.TUNE_SEEDS]
    edge = {"onpolicy": 0.65, "grpo_async": 0.6, "onpolicy_prev_window": 0.55}  # above, tie (goes low), below
    rows = [_tune(a, 2e-4, s, v) for a, v in edge.items() for s in rerun.TUNE_SEEDS]
    cells, chosen, missing = rep.edge_step(stage1, rows)
    assert missing == 0 and chosen == {"onpolicy": 2e-4, "grpo_async": 1e-4, "onpolicy_prev_window": 1e-4}
    block = rep.edge_block(cells, chosen, missing)
    assert "| `onpolicy` | 0.600 +- 0.000 | **0.650 +- 0.000** | 0.0002 | 0.0002 |" in block
    assert "Moved to 2e-4 (the replication uses it" in block and "`onpolicy`." in block
    cells, chosen, missing = rep.edge_step(stage1, rows[:-1])
    assert missing == 1 and chosen["onpolicy_prev_window"] is None
    assert "pending: 1 of the 9 edge runs not in" in rep.edge_block(cells, chosen, missing)
    with pytest.raises(ValueError, match=r"line 2: val_accuracy_start 0.3 is not stage 1's \(0.2734375\)"):
        rep.edge_step(stage1, [_tune("onpolicy", 2e-4, 100, 0.6, start="0.3")])


def _replication_rows(task, shifts, lrs, noise_sd=0.004, ws_sd=0.006, seed=0, extra=True):
    """72 rows: onpolicy = base + warm-start and seed noise; grpo_async = onpolicy + H1 shift; the window arm =
    grpo_async + H2 shift (each arm its own noise). Readouts: greedy = the score + 0.01, pass@16 = 0.9 - score
    (so a gain in mean@16 reverses there), pass@4 = score + 0.1, entropy = 0.3 - score."""
    rng = np.random.default_rng(seed)
    rows = []
    for w in rep.WARM_STARTS[task]:
        base_w = 0.6 + rng.normal(0, ws_sd)
        for s in rep.SEEDS:
            on = base_w + rng.normal(0, noise_sd)
            scores = {"onpolicy": on, "grpo_async": on + shifts[0] + rng.normal(0, noise_sd)}
            scores["onpolicy_prev_window"] = scores["grpo_async"] + shifts[1] + rng.normal(0, noise_sd)
            for arm, v in scores.items():
                row = {"arm": arm, "model.warmstart.seed": str(w), "seed": str(s), "learning_rate": repr(lrs[arm]),
                       "test_mean_at_16": repr(v), "val_accuracy_start": "0.29"}
                if extra:
                    row.update(test_greedy_accuracy=repr(v + 0.01), test_pass_at_4=repr(v + 0.1),
                               test_pass_at_16=repr(0.9 - v), train_entropy_end=repr(0.3 - v))
                rows.append(row)
    return rows


def _write(path, rows):
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)


def _folder(tmp_path, default_rows=None, multistep_rows=None, edge=True):
    """A results folder: the real stage 1 rows, an edge step that moves nothing, and the given replication rows."""
    results = tmp_path / "sweeps" / "results"
    results.mkdir(parents=True)
    for name in ("stale_tune_default", "stale_headline_default", "stale_headline_multistep"):
        shutil.copy(RESULTS / f"{name}.csv", results)
    if edge:
        _write(results / "replication_edge_default.csv",
               [_tune(a, 2e-4, s, 0.3, start="0.2734375") for a in rep.ARMS for s in rerun.TUNE_SEEDS])
    for task, rows in (("default", default_rows), ("multistep", multistep_rows)):
        if rows is not None:
            _write(results / f"replication_{task}.csv", rows)
    return results


LRS = {"default": dict.fromkeys(rep.ARMS, 1e-4), "multistep": dict.fromkeys(rep.ARMS, 5e-5)}


def test_the_analysis_with_the_warm_start_as_the_unit_by_hand(tmp_path):
    shifts = {"default": (0.05, 0.03), "multistep": (0.0, -0.0005)}
    rows = {t: _replication_rows(t, shifts[t], LRS[t], seed=i) for i, t in enumerate(rep.TASKS)}
    results = _folder(tmp_path, rows["default"], rows["multistep"])
    values = {t: rep.read_replication(rows[t], t, LRS[t], t) for t in rep.TASKS}
    assert all(missing == 0 for _, missing in values.values())
    tests = rep.analyse({t: v for t, (v, _) in values.items()})
    by = {(t.task, t.name): t for t in tests}
    raw, tost = {}, {}
    for t in tests:  # the t over the 12 warm-start means, by hand
        v = values[t.task][0][rep.METRIC]
        means = [np.mean([v[t.arm][(w, s)] - v[t.base][(w, s)] for s in rep.SEEDS]) for w in rep.WARM_STARTS[t.task]]
        res = st.ttest_1samp(means, 0.0)
        assert t.df == 11 and t.diff == pytest.approx(np.mean(means)) and t.p == pytest.approx(res.pvalue)
        assert t.se == pytest.approx(np.std(means, ddof=1) / math.sqrt(12))
        assert t.ci95 == pytest.approx(st.t.interval(0.95, 11, loc=np.mean(means), scale=t.se))
        lo90, hi90 = st.t.interval(0.90, 11, loc=np.mean(means), scale=t.se)
        assert t.ci90 == pytest.approx((lo90, hi90))
        # TOST: the larger one-sided p, against -margin and +margin
        p_lo = st.ttest_1samp(means, -rep.MARGIN, alternative="greater").pvalue
        p_hi = st.ttest_1samp(means, rep.MARGIN, alternative="less").pvalue
        assert t.tost_p == pytest.approx(max(p_lo, p_hi))
        raw[(t.task, t.name)], tost[(t.task, t.name)] = res.pvalue, max(p_lo, p_hi)
    for family in (("H2",), ("H1", "H3")):  # Holm by hand within each family, of p and of TOST p apart
        keys = [(t, h) for t in rep.TASKS for h in ("H1", "H2", "H3") if h in family]
        for source, attr in ((raw, "holm_p"), (tost, "holm_tost_p")):
            order = sorted(keys, key=lambda k: source[k])
            running = 0.0
            for i, k in enumerate(order):
                running = max(running, min(1.0, (len(keys) - i) * source[k]))
                assert getattr(by[k], attr) == pytest.approx(running), (k, attr)
    assert by[("default", "H1")].verdict == "better" and by[("default", "H2")].verdict == "better"
    assert by[("multistep", "H1")].verdict == "on par" and by[("multistep", "H2")].verdict == "on par"
    assert by[("default", "H1")].positive == 12
    blocks = rep.blocks(results)
    h2 = by[("default", "H2")]
    assert (f"| H2 | `onpolicy_prev_window` - `grpo_async` | {h2.diff:+.3f} +- {h2.se:.3f} | [{h2.ci95[0]:+.3f}, "
            f"{h2.ci95[1]:+.3f}] | [{h2.ci90[0]:+.3f}, {h2.ci90[1]:+.3f}] | {h2.t:+.2f} |") in blocks["results"]
    assert f"**better**: {rep.READINGS[('H2', 'better')]}" in blocks["results"]
    assert f"**on par**: {rep.READINGS[('H2', 'on par')]}" in blocks["results"]
    # readouts: greedy follows mean@16 (survives), pass@16 = 0.9 - score reverses: the sharpening reading
    text = blocks["readouts"]
    assert f"| H2 | `onpolicy_prev_window` - `grpo_async` | greedy accuracy | {h2.diff:+.3f} +- {h2.se:.3f} |" in text
    assert rep.READOUT_WORDS["survives"] in text
    assert f"{rep.READOUT_WORDS['reverses']}; {rep.SHARPENING['reverses']}" in text
    assert "| H1 | `grpo_async` - `onpolicy` | final entropy |" in text and "lower entropy" in text
    # the rerun's conclusions re-read, and each of its readings (the run as the unit) against the replication's
    text = blocks["conclusions"]
    assert "- default: the gain is the window, asynchrony is neutral (H2 on par and H3 better): **does not hold**" in text
    assert "one step of staleness costs accuracy under the window (H2 better): **holds**" in text
    assert "| default | H2 | better | better | replicates |" in text
    assert "| multistep | H2 | on par | on par | replicates |" in text
    assert "| multistep | H1 | better | on par | does not replicate |" in text
    # the power the design had, from the replication's own components (by hand: the one-way ANOVA, then the
    # noncentral t at Holm's first step, alpha 0.05 / 2 for H2)
    v = values["default"][0][rep.METRIC]
    d = np.array([[v["onpolicy_prev_window"][(w, s)] - v["grpo_async"][(w, s)] for s in rep.SEEDS]
                  for w in rep.WARM_STARTS["default"]])
    msb, msw = 2 * d.mean(axis=1).var(ddof=1), d.var(axis=1, ddof=1).mean()
    var_mean = max(0.0, (msb - msw) / 2) + msw / 2
    crit, nc = st.t.ppf(1 - 0.025 / 2, 11), rep.MARGIN / math.sqrt(var_mean / 12)
    power = st.nct.sf(crit, 11, nc) + st.nct.cdf(-crit, 11, nc)
    assert f"| default | H2 | {math.sqrt(max(0.0, (msb - msw) / 2)):.4f} (" in blocks["power"]
    assert f"| {math.sqrt(var_mean / 12):.4f} | {power:.2f} (" in blocks["power"]
    assert "The power the design had for H2 (primary) at +-0.02, " in blocks["readme"]
    assert f"(t test at the margin; TOST at 0): default: t {power:.2f}, TOST " in blocks["readme"]
    # the README's claims: each comparison at each unit, the replication's reading cited, and the rerun's
    # recommendation rule applied to the replication's readings (H1 better on default, on par on multistep)
    text = blocks["readme"]
    assert (f"| default | H2 `onpolicy_prev_window` - `grpo_async` | +0.019 [+0.011, +0.028], p 0.001 (Holm 0.006), "
            f"TOST p 0.423: better | +0.019 [-0.012, +0.050], p 0.121; 3 of 3 warm starts > 0 | {h2.diff:+.3f} [{h2.ci95[0]:+.3f}, {h2.ci95[1]:+.3f}], p "
            f"{rep._p(h2.p)} (Holm {rep._p(h2.holm_p)}); TOST p (Holm) {rep._p(h2.holm_tost_p)}; 12 of 12 warm starts "
            "> 0 | **better** |") in text
    assert "| multistep | H1 `grpo_async` - `onpolicy` |" in text and text.count("| **on par** |") == 3  # multistep H1, H2, H3
    assert ("| asynchronous generation (lag 1) | `algo=grpo_async`: at or above on-policy GRPO (default better, "
            "multistep on par) |") in text and "use (the replication's reading)" in text


def test_the_blocks_are_pending_until_every_row_is_in_and_the_page_markers_read_the_rows(tmp_path):
    rows = _replication_rows("default", (0.05, 0.03), LRS["default"])
    results = _folder(tmp_path, rows[:-2])
    blocks = rep.blocks(results)
    assert "**default**: pending, 2 of the 72 runs not in `sweeps/results/replication_default.csv`." in blocks["results"]
    assert "**multistep**: pending, 72 of the 72 runs not in" in blocks["results"]
    assert "Holm" in blocks["results"] and "| H2 |" not in blocks["results"]
    assert "**default**: pending" in blocks["readouts"] and blocks["conclusions"].startswith("Pending")
    assert "| pending (2 of 72 runs not in) | pending |" in blocks["readme"]
    assert "| default | pending: 2 of the 72 runs not in |" in blocks["power"]
    assert "recommendation (the rerun's rule on the replication's readings) is pending" in blocks["readme"]
    # one task in: its table, the readings pending (Holm spans both tasks)
    (results / "replication_default.csv").unlink()
    _write(results / "replication_default.csv", rows)
    blocks = rep.blocks(results)
    assert "| H2 | `onpolicy_prev_window` - `grpo_async` |" in blocks["results"]
    assert "| pending |" in blocks["results"] and "**better**" not in blocks["results"]
    # sweeps/doc_tables.py writes the blocks from the rows of the folder it is given
    doc = ("# t\n<!-- generated by sweeps/replication.py: results -->\n| typed | 0.9 |\n<!-- end generated -->\n"
           "<!-- generated by sweeps/replication.py: edge -->\n<!-- end generated -->\n")
    new, changed = doc_tables.apply(doc, doc_tables.generator(tmp_path))
    assert changed == ["replication.py: results", "replication.py: edge"] and "typed" not in new
    assert blocks["results"] in new and blocks["edge"] in new
    assert doc_tables.apply(new, doc_tables.generator(tmp_path)) == (new, [])
    with pytest.raises(KeyError, match="replication.py: nope is marked but not generated"):
        doc_tables.apply("<!-- generated by sweeps/replication.py: nope -->\n<!-- end generated -->\n",
                         doc_tables.generator(tmp_path))


def test_rows_outside_the_registration_are_refused_by_line(tmp_path):
    rows = _replication_rows("multistep", (0.0, 0.0), LRS["multistep"], extra=False)
    for change, want in [({"model.warmstart.seed": "3"}, r"line 2: \(onpolicy, warm start 3, seed 200\) is not in "
                                                         r"the registered grid"),
                         ({"seed": "0"}, "is not in the registered grid"),
                         ({"learning_rate": "0.0001"}, r"line 2: onpolicy ran at learning_rate '0.0001', not its "
                                                       r"registered 5e-05"),
                         ({"learning_rate": ""}, "ran at learning_rate ''")]:
        with pytest.raises(ValueError, match=want):
            rep.read_replication([{**rows[0], **change}, *rows[1:]], "multistep", LRS["multistep"], "x")
    with pytest.raises(ValueError, match=r"duplicate \(arm=onpolicy, model.warmstart.seed=30, seed=200\)"):
        rep.read_replication([*rows, dict(rows[0])], "multistep", LRS["multistep"], "x")
    with pytest.raises(ValueError, match="before the edge step chose its lr"):
        rep.read_replication(_replication_rows("default", (0, 0), LRS["default"])[:3], "default",
                             dict.fromkeys(rep.ARMS), "x")
    values, missing = rep.read_replication(rows, "multistep", LRS["multistep"], "x")
    assert missing == 0 and set(values) == {rep.METRIC}  # no readout columns: none read
    results = _folder(tmp_path, None, rows)
    (results / "replication_edge_default.csv").unlink()
    res = subprocess.run([sys.executable, "sweeps/replication.py", "--results", str(results), "--tuned-lr", "default"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "pending: the edge step's rows are not all in" in res.stderr
    res = subprocess.run([sys.executable, "sweeps/replication.py", "--results", str(results), "--tuned-lr", "multistep"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == ("tuned_lr.onpolicy=5e-05 tuned_lr.grpo_async=5e-05 "
                                                          "tuned_lr.onpolicy_prev_window=5e-05")


def test_the_two_sweeps_compose_as_registered():
    sys.path.insert(0, str(REPO_ROOT / "sweeps"))
    from sweep_status import config_grid

    edge = compose_sweep("replication_edge", [])
    assert grid(edge) == {"correction_arm": list(rep.ARMS), "algo.learning_rate": ["0.0002"],
                          "seed": ["100", "101", "102"]}
    assert edge.model.warmstart.seed == 3 and edge.final_eval.split == "val" and list(edge.final_eval.ks) == [4, 16]
    lrs = [f"tuned_lr.{a}=1e-4" for a in rep.ARMS]
    main = compose_sweep("replication", lrs)
    assert grid(main) == {"correction_arm": list(rep.ARMS),
                          "model.warmstart.seed": [str(w) for w in rep.WARM_STARTS["default"]],
                          "seed": [str(s) for s in rep.SEEDS]}
    assert main.final_eval.split == "test" and list(main.final_eval.ks) == [4, 16] and main.task_name == "replication"
    assert main.data.val_size == 1024 and main.data.test_size == 1024 and main.trainer.max_steps == 1000
    # multistep: its warm starts on the command line replace the file's (Hydra's basic sweeper: the command wins)
    ms = ",".join(map(str, rep.WARM_STARTS["multistep"]))
    assert config_grid("replication", ["data=multistep", f"model.warmstart.seed={ms}"])["model.warmstart.seed"] == \
        [str(w) for w in rep.WARM_STARTS["multistep"]]
    # so does a single value of a key the file sweeps (the refresh screen's multistep lr): no phantom 1e-4 jobs
    tune = config_grid("refresh_screen_tune", ["data=multistep", "algo.learning_rate=5e-5"])
    assert tune["algo.learning_rate"] == ["5e-5"] and len(tune["correction_arm"]) == 6
    cfg = compose_sweep("replication", [*lrs, "correction_arm=grpo_async", "model.warmstart.seed=30", "seed=201"])
    assert cfg.model.warmstart.seed == 30 and cfg.seed == 201
    text = yaml.safe_load((REPO_ROOT / "sweeps" / "replication.yaml").read_text())
    assert text["final_eval"] == {"ks": [4, 16]}
