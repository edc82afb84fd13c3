"""sweeps/report.py: the statistics report over sweep folders, on a hand-made folder whose numbers are computed
by hand and on a real tiny multirun of src/train.py."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import shutil
import subprocess
import sys

import pytest
import yaml
from conftest import REPO_ROOT

spec = importlib.util.spec_from_file_location("report", REPO_ROOT / "sweeps" / "report.py")
report = importlib.util.module_from_spec(spec)
sys.modules["report"] = report  # its dataclass looks its module up
spec.loader.exec_module(report)


def _job(root, name, overrides, summary, max_steps=200, metrics=True):
    """A job folder as src/train.py writes it: .hydra/overrides.yaml and config.yaml, summary.json, metrics.csv."""
    job = root / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (job / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"trainer": {"max_steps": max_steps}}))
    if summary is not None:
        base = {"steps": max_steps, "interrupted": False, "val_accuracy_start": 0.297, "completions": 64 * max_steps,
                "val_history": [{"step": 0, "accuracy": 0.3}, {"step": max_steps, "accuracy": 0.4}]}
        (job / "summary.json").write_text(json.dumps({**base, **summary}))
    if metrics:
        with (job / "metrics.csv").open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["step", "train/reward", "train/time/elapsed", "val/accuracy"])
            w.writerow([0, "", "", 0.3])
            for step in range(max_steps):
                w.writerow([step, 0.1 + step / 1000, 0.5 * (step + 1), ""])
    return job


@pytest.fixture
def crafted(tmp_path):
    """Arms typed as `algo=` plus a `seed=` and a constant override; b lacks seed 2 (interrupted) and a run
    stopped at 73 of 200 steps; a's seed 2 has another warm start; one job never wrote summary.json; c differs
    in steps, generated samples and test split."""
    root = tmp_path / "sweep"
    common = ["trainer.max_steps=200", "hydra.job.chdir=false"]
    values = {("a", 0): 0.5, ("a", 1): 0.6, ("a", 2): 0.7, ("b", 0): 0.4, ("b", 1): 0.45}
    for i, ((arm, seed), v) in enumerate(values.items()):
        extra = {"val_accuracy_start": 0.316} if (arm, seed) == ("a", 2) else {}
        _job(root, f"{i}_{arm}{seed}", [f"algo={arm}", f"seed={seed}", *common], {"test_mean_at_16": v, **extra})
    _job(root, "5_b2", ["algo=b", "seed=2", *common], {"test_mean_at_16": 0.9, "interrupted": True, "steps": 150})
    _job(root, "6_b3", ["algo=b", "seed=3", *common], {"test_mean_at_16": 0.9, "steps": 73})
    _job(root, "7_b4", ["algo=b", "seed=4", *common], None)
    for seed, v in ((0, 0.3), (1, 0.35)):  # an arm of 100 steps, half the completions, its own test prompts
        job = _job(root, f"8_c{seed}", ["algo=c", f"seed={seed}", "trainer.max_steps=100", "hydra.job.chdir=false"],
                   {"test_mean_at_16": v, "completions": 32 * 100}, max_steps=100)
        (job / "final_eval.json").write_text(json.dumps({"per_prompt": {"arith/1+1": 1.0, "arith/2+2": 0.0}}))
    return root  # trainer.max_steps differs between jobs, so it names the arms too


def test_hand_made_sweep_statistics_and_warnings(crafted, tmp_path, capsys):
    out = tmp_path / "rep"
    assert report.main([str(crafted), "--vs", "b", "--margin", "0.2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert "paired diff vs `algo=b trainer.max_steps=200` +- SE" in lines[0] and "TOST p (+-0.2)" in lines[0]
    assert lines[2].startswith("| `algo=b trainer.max_steps=200` | 0, 1 | 2 | 0.425 +- 0.025 | baseline |")  # sd of 0.4, 0.45 / sqrt 2
    # a on seeds 0, 1, 2: mean 0.6, SE 0.1 / sqrt 3; paired on seeds 0, 1: differences 0.1, 0.15 -> mean 0.125,
    # SE (sd 0.0354) / sqrt 2 = 0.025, t = 5 on 1 df: p = 1 - 2 atan(5) / pi = 0.126; two pairs: the t interval,
    # 0.125 +- t(0.975, 1 df) 0.025 = 0.125 +- tan(0.475 pi) 0.025 (not the bootstrap's [0.100, 0.150], the range of
    # the two); TOST within +-0.2: t = (0.125 - 0.2) / 0.025 = -3 on 1 df, p = 0.5 - atan(3) / pi
    a = lines[3].split(" | ")
    assert a[:4] == ["| `algo=a trainer.max_steps=200`", "0, 1, 2", "3", f"0.600 +- {0.1 / math.sqrt(3):.3f}"]
    half = math.tan(0.475 * math.pi) * 0.025  # the 97.5% point of t on 1 df (Cauchy): 12.706
    assert a[4:8] == ["+0.125 +- 0.025 (n=2)", f"[{0.125 - half:+.3f}, {0.125 + half:+.3f}] (t)",
                      f"{1 - 2 * math.atan(5) / math.pi:.3f}", f"{0.5 - math.atan(3) / math.pi:.3f}"]
    assert "seeds differ: 0, 1, 2 vs baseline 0, 1" in a[8] and "warm starts differ: 0.297, 0.316 vs baseline 0.297" in a[8]
    c = lines[4].split(" | ")
    assert c[:5] == ["| `algo=c trainer.max_steps=100`", "0, 1", "2", "0.325 +- 0.025", "-0.100 +- 0.000"]
    # both seeds differ by -0.1 (up to float rounding): zero variance, said, no interval or test (not an error)
    assert c[5:8] == ["none: zero variance"] * 3 and "zero variance: all 2 pairs differ by -0.100" in c[8]
    assert "steps differ: 100 vs baseline 200" in c[8] and "test splits differ: prompts " in c[8]
    assert "generated samples differ: 32 completions/step, eval n=16 vs baseline 64 completions/step, eval n=16" in c[8]
    assert "SE = sample standard deviation / sqrt(n)" in text and "paired t-test" in text
    left = [w for w in lines if w.startswith("- left out")]
    assert len(left) == 3 and "interrupted at step 150" in left[0] and "stopped short, 73 of 200 steps" in left[1]
    assert "no summary.json" in left[2]
    with (out / "report.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["arm"] for r in rows] == ["algo=b trainer.max_steps=200", "algo=a trainer.max_steps=200", "algo=c trainer.max_steps=100"] and float(rows[1]["diff"]) == pytest.approx(0.125)
    assert float(rows[1]["p_paired_t"]) == pytest.approx(1 - 2 * math.atan(5) / math.pi)
    assert (out / "report.md").read_text().startswith(lines[0])
    assert (out / "curves.png").stat().st_size > 10_000 and (out / "differences.png").stat().st_size > 5_000


def test_curve_file_and_redrawing_from_it(crafted, tmp_path, capsys):
    curves = tmp_path / "curves.csv"
    report.main([str(crafted), "--vs", "algo=b trainer.max_steps=200", "--curves-out", str(curves), "--out", str(tmp_path / "r1")])
    with curves.open() as fh:
        rows = list(csv.DictReader(fh))
    a0 = [r for r in rows if r["arm"] == "algo=a trainer.max_steps=200" and r["seed"] == "0"]
    assert [int(r["step"]) for r in a0] == list(range(0, 201, 10))  # validation at 0 and 200, every 10 steps
    assert a0[0]["val_accuracy"] == "0.3" and a0[0]["train_reward"] == "" and a0[-1]["val_accuracy"] == "0.4"
    # the reward of steps 1..10 (metrics rows 0..9: 0.100 .. 0.109) averaged; time at step 10 is 5 s
    assert float(a0[1]["train_reward"]) == pytest.approx(0.1045) and float(a0[1]["time_s"]) == 5.0
    assert {r["arm"] for r in rows} == {"algo=a trainer.max_steps=200", "algo=b trainer.max_steps=200", "algo=c trainer.max_steps=100"} and len({(r["arm"], r["seed"]) for r in rows}) == 7
    capsys.readouterr()
    report.main([str(curves), "--out", str(tmp_path / "r2")])  # no runs needed: the figures from the file
    assert "no job rows in the inputs (curve files only)" in capsys.readouterr().out
    assert (tmp_path / "r2" / "curves.png").stat().st_size > 10_000


def test_results_csv_and_bad_arguments(tmp_path, capsys):
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["arm", "seed", "steps", "test_mean_at_16", "val_accuracy_start"])
        w.writerows([["on", 0, 1000, 0.5, 0.297], ["on", 1, 1000, 0.6, 0.297], ["async", 0, 1000, 0.55, 0.297],
                     ["async", 1, 1000, 0.7, 0.297], ["async", 2, 1000, 0.9, 0.316]])
    report.main([str(path), "--vs", "on", "--start", "0.297", "--out", str(tmp_path / "r")])
    out = capsys.readouterr().out
    half = math.tan(0.475 * math.pi) * 0.025  # two pairs: the t interval on 1 df
    assert f"| `arm=async` | 0, 1 | 2 | 0.625 +- 0.075 | +0.075 +- 0.025 | [{0.075 - half:+.3f}, {0.075 + half:+.3f}] (t) |" in out
    with path.open("a", newline="") as fh:  # seed 0 of `on` again, from another machine's warm start
        csv.writer(fh).writerow(["on", 0, 1000, 0.9, 0.316])
    with pytest.raises(SystemExit):  # refused, naming both rows and the warm starts, not resolved by keeping one
        report.main([str(path), "--vs", "on", "--out", str(tmp_path / "r")])
    assert (f"error: duplicate (arm=`arm=on`, seed=0): {path}:1 and {path}:6; the rows come from 2 warm starts "
            "(val_accuracy_start 0.297, 0.316): --start keeps one") in capsys.readouterr().err
    report.main([str(path), "--vs", "on", "--start", "0.316", "--out", str(tmp_path / "r")])  # one machine's rows
    assert "| `arm=on` | 0 | 1 | 0.900 +- - | baseline |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        report.main([str(path), "--vs", "nope", "--out", str(tmp_path / "r")])
    assert "--vs 'nope' matches 0 arms (none); the arms are: arm=async; arm=on" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        report.main([str(path), "--margin", "-1"])
    assert "--margin must be positive" in capsys.readouterr().err
    split = tmp_path / "split.csv"  # one arm per warm start: --vs names two until the warm start pairs
    with split.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["arm", "model.warmstart.seed", "seed", "test_mean_at_16"])
        w.writerows([[a, ws, s, 0.5 + 0.1 * s + (a == "async") * 0.05] for a in ("on", "async") for ws in (0, 1)
                     for s in (0, 1)])
    with pytest.raises(SystemExit):
        report.main([str(split), "--vs", "on", "--out", str(tmp_path / "r")])
    assert ("; if they are one arm over model.warmstart.seed, pair on it: --seed-key seed --seed-key "
            "model.warmstart.seed") in capsys.readouterr().err
    report.main([str(split), "--vs", "on", "--seed-key", "seed", "--seed-key", "model.warmstart.seed",
                 "--out", str(tmp_path / "r")])
    assert "+0.050 +- 0.000" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        report.main([str(split), "--metric", "val_mean_at_16", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert "--metric val_mean_at_16: no job has a number for it; name one with --metric" in err
    assert "numeric keys: " in err and "test_mean_at_16" in err
    no_seed = tmp_path / "no_seed.csv"
    no_seed.write_text("arm,test_mean_at_16\non,0.5\n")
    with pytest.raises(SystemExit):
        report.main([str(no_seed), "--out", str(tmp_path / "r")])
    assert "row 1 has no 'seed' column; a results CSV needs 'arm' and 'seed' (its columns: arm, test_mean_at_16)" \
        in capsys.readouterr().err


@pytest.mark.slow
def test_real_tiny_multirun(tiny_sweep, tmp_path):
    """The report on a real multirun's folder (conftest's shared tiny sweep, arm=k1,k2 seed=0,1): arms named by the
    typed override, matched by seed, curves drawn."""
    sweep = tiny_sweep
    curves = tmp_path / "curves.csv"
    proc = subprocess.run([sys.executable, "sweeps/report.py", str(sweep), "--vs", "k1", "--margin", "0.05",
                           "--curves-out", str(curves), "--curve-every", "2", "--out", str(tmp_path / "report")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "test_mean_at_2 mean +- SE" in lines[0] and "vs `arm=k1`" in lines[0]
    assert lines[2].startswith("| `arm=k1` | 0, 1 | 2 |") and lines[3].startswith("| `arm=k2` | 0, 1 | 2 |")
    # same seeds, warm start, steps, test split and samples: no warning (a random model may score the same on both
    # seeds: then the note of a zero-variance difference, said in words); no job left out
    assert lines[2].endswith("|  |") and "Warnings:" not in proc.stdout
    assert lines[3].endswith("|  |") or lines[3].split(" | ")[-1].startswith("zero variance: all 2 pairs differ by")
    with curves.open() as fh:
        rows = list(csv.DictReader(fh))
    assert sorted({(r["arm"], r["seed"]) for r in rows}) == [("arm=k1", "0"), ("arm=k1", "1"), ("arm=k2", "0"),
                                                            ("arm=k2", "1")]
    assert [r["step"] for r in rows[:3]] == ["0", "2", "4"] and rows[2]["train_reward"] != ""
    assert (tmp_path / "report" / "curves.png").stat().st_size > 10_000
    # the same jobs exported without naming the grid (every override but the seed in the arm column), then
    # reported from the CSV: the same arms, numbers and baseline as the folder's report (a new user's --vs failed)
    rows = tmp_path / "rows.csv"
    export = subprocess.run([sys.executable, "sweeps/sweep_status.py", str(sweep), "--csv", str(rows)], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120)
    assert export.returncode == 0 and "4 rows added" in export.stdout, export.stdout + export.stderr
    from_csv = subprocess.run([sys.executable, "sweeps/report.py", str(rows), "--vs", "k1", "--margin", "0.05",
                               "--out", str(tmp_path / "report_csv")], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=300)
    assert from_csv.returncode == 0, from_csv.stderr[-3000:]
    assert from_csv.stdout.splitlines()[:4] == lines[:4]


@pytest.mark.slow
def test_render_leaves_out_an_interrupted_job(tiny_sweep, tmp_path):
    """notebooks/render.py used to average an interrupted job with finished ones without a word; now it leaves it
    out with the report's filter and says so."""
    import nbformat

    sweep = tmp_path / "sweep"
    shutil.copytree(tiny_sweep, sweep, ignore=shutil.ignore_patterns("checkpoints", "report"))
    summary_path = next(p for p in sorted(sweep.glob("3_*/summary.json")))
    summary = json.loads(summary_path.read_text())
    summary.update(interrupted=True, signal="SIGTERM")
    summary_path.write_text(json.dumps(summary))
    figures = tmp_path / "figures"
    proc = subprocess.run([sys.executable, "notebooks/render.py", str(sweep), "--figures", str(figures)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "render.py: warning: left out" in proc.stderr and "3_seed-1" in proc.stderr
    nb = nbformat.read(figures / "onpolicy_vs_offpolicy.ipynb", as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if o.get("name") == "stdout")
    assert "3 runs in 2 arms" in text and "WARNING: left out" in text and "interrupted at step 4" in text


def test_a_half_written_summary_is_a_job_left_out_with_one_warning_not_a_traceback(crafted, tmp_path):
    """Issue 39 (item 13): a summary.json cut short (written before it was written atomically, or by hand) and a
    final_eval.json cut short: the report reads the first as a job not finished, with one warning naming it."""
    job = _job(crafted, "9_b5", ["algo=b", "seed=5", "trainer.max_steps=200", "hydra.job.chdir=false"], None)
    (job / "summary.json").write_text('{"steps": 200, "interrupted": false, "test_mean_at_')
    a0 = crafted / "0_a0"
    (a0 / "final_eval.json").write_text('{"per_prompt": {"arith/1+1": 1.')
    proc = subprocess.run([sys.executable, "sweeps/report.py", str(crafted), "--vs", "b", "--out", str(tmp_path / "r")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    named = [line for line in proc.stdout.splitlines() if str(job / "summary.json") in line]
    assert len(named) == 1 and named[0].startswith(f"- left out {job}") and "not finished" in named[0], proc.stdout
    assert sum(str(a0 / "final_eval.json") in line for line in proc.stdout.splitlines()) == 1
    assert "| `algo=a trainer.max_steps=200` | 0, 1, 2 | 3 |" in proc.stdout  # a0 is in: its summary is whole


def test_one_job_without_the_test_score_is_left_out_by_name_not_a_switch_of_metric(crafted, tmp_path, capsys):
    """Issue 39 (item 16): the default metric was test_mean_at_<n> only when every job had it, so one job without
    a test score switched the whole report to val_accuracy_end without a word."""
    no_test = _job(crafted, "9_a3", ["algo=a", "seed=3", "trainer.max_steps=200", "hydra.job.chdir=false"],
                   {"val_accuracy_end": 0.45})
    report.main([str(crafted), "--vs", "b", "--out", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert "test_mean_at_16 mean +- SE" in out.splitlines()[0] and "val_accuracy_end" not in out.splitlines()[0]
    assert f"- left out {no_test}: no number for test_mean_at_16 in its summary" in out
    assert "| `algo=a trainer.max_steps=200` | 0, 1, 2 | 3 |" in out
    report.main([str(crafted), "--vs", "b", "--metric", "val_accuracy_end", "--out", str(tmp_path / "r")])
    assert "val_accuracy_end mean +- SE" in capsys.readouterr().out  # named: every job has it


def test_a_duplicate_row_is_refused_with_its_key_and_rows(tmp_path, capsys):
    """Issue 39 (item 12): two rows of one (arm, seed) were resolved by keeping the first, with a warning."""
    path = tmp_path / "rows.csv"
    path.write_text("arm,seed,test_mean_at_16\non,0,0.5\non,1,0.6\nasync,0,0.55\nasync,1,0.7\non,1,0.65\n")
    with pytest.raises(SystemExit):
        report.main([str(path), "--vs", "on", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(f"error: duplicate (arm=`arm=on`, seed=1): {path}:2 and {path}:5; each (arm, seed) is "
                            "one run: remove one, or pair on another key with --seed-key"), err


def test_few_pairs_get_a_t_interval_one_pair_and_zero_variance_are_said_in_words(tmp_path, capsys):
    """Issue 39 (item 15): two seeds gave the range of the two differences as a "bootstrap 95% CI" beside
    p = 0.40; one common seed a zero-width interval; a constant difference p = 1e-31 or "-" by the rounding."""
    path = tmp_path / "rows.csv"
    rows = [("on", 0, 0.5), ("on", 1, 0.6), ("on", 2, 0.4), ("two", 0, 0.449), ("two", 1, 0.592),
            ("one", 0, 0.55), ("flat", 0, 0.6), ("flat", 1, 0.7), ("flat", 2, 0.5)]
    path.write_text("arm,seed,test_mean_at_16\n" + "".join(f"{a},{s},{v}\n" for a, s, v in rows))
    report.main([str(path), "--vs", "on", "--out", str(tmp_path / "r")])
    out = capsys.readouterr().out
    cells = {line.split(" | ")[0].strip("| `"): line.split(" | ") for line in out.splitlines() if line.startswith("| `")}
    assert "95% CI" in out.splitlines()[0] and "bootstrap 95% CI" not in out.splitlines()[0]
    two = cells["arm=two"]  # differences -0.051 and -0.008: mean -0.0295, SE 0.0215, p = 0.40 (t = -1.37, 1 df)
    half = math.tan(0.475 * math.pi) * 0.0215  # the t interval on 1 df, which holds 0 as p says
    assert two[4] == "-0.029 +- 0.021" and two[5] == f"[{-0.0295 - half:+.3f}, {-0.0295 + half:+.3f}] (t)"
    assert two[6] == f"{1 - 2 * math.atan(0.0295 / 0.0215) / math.pi:.3f}" == "0.401"
    one = cells["arm=one"]
    assert one[4] == "+0.050 (n=1)" and one[5] == "none: 1 pair" and one[6] == "none: 1 pair"
    flat = cells["arm=flat"]  # +0.1 on every seed, 0.6 - 0.5 and 0.7 - 0.6 not equal as floats
    assert flat[4] == "+0.100 +- 0.000" and flat[5] == "none: zero variance" and flat[6] == "none: zero variance"
    assert "all 3 pairs differ by +0.100" in flat[7]
    assert "t interval" in out and "below 10 pairs" in out
    assert (tmp_path / "r" / "differences.png").stat().st_size > 5_000
    with (tmp_path / "r" / "report.csv").open() as fh:
        by_arm = {r["arm"]: r for r in csv.DictReader(fh)}
    assert by_arm["arm=two"]["ci_method"] == "t" and by_arm["arm=one"]["ci_low"] == ""
    assert by_arm["arm=flat"]["p_paired_t"] == "" and "zero variance" in by_arm["arm=flat"]["note"]
