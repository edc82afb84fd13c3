"""The state of every job of a sweep folder, and the command that finishes the sweep.

Works for any Hydra multirun of ``src/train.py`` (a grid on the command line or a ``sweeps/*.yaml`` config, run
with any launcher, in one folder or in batches below it). Every job folder (one with ``.hydra/overrides.yaml``) is
``finished``, ``interrupted`` (resumable from ``checkpoints/last.ckpt``), ``failed`` (``error.txt``), ``running or
killed`` (started, nothing saved yet) or ``not started`` (in the grid of a ``multirun.yaml`` below the folder, or of
``--config`` / ``key=a,b`` arguments, without a folder); see ``grpolab/app/sweep_resume.py``::

    python sweeps/sweep_status.py multirun/train/<time>
    python sweeps/sweep_status.py $S --config corrections_small data=multistep   # the grid of a sweeps/ config
    python sweeps/sweep_status.py $S correction_arm=onpolicy,k10_ppo seed=0,1      # a grid given here
    python sweeps/sweep_status.py $S --csv sweeps/results/corrections_small_default.csv   # keep the results

It then prints the rerun of each ``multirun.yaml``'s command into its own folder, which skips the finished jobs and
resumes the interrupted ones, and the grid points no folder holds (an Optuna search, ``hydra/sweeper=optuna``,
has no grid: its rerun continues the study). ``--csv`` appends one row per job that finished
with every number it owes (``grpolab/app/run_folder.py``: not interrupted or failed, ``trainer.max_steps`` steps, the final
eval's score when ``final_eval.enabled``) to a results file: :data:`COLUMNS` (``learning_rate``: the one the run
trained at, from its ``summary.json``, also where the grid does not vary it), every final-eval score of its
``summary.json`` (``test_``/``val_``: ``mean_at_<n>`` and its ``_se``, ``greedy_accuracy``, ``pass_at_<k>``), the
final entropy of its training completions (``train_entropy_end``: the mean of ``metrics.csv``'s ``train/entropy``
over the last 10 optimizer steps), and one column per other key the grid varies, named by the key
(``algo.learning_rate``, ``model.warmstart.seed``): the record of a screen run over several days on machines that do
not keep their folders. A row's key is (arm, seed, val_accuracy_start, grid values); a key the file holds with the
same values is skipped, so a rerun of the export leaves the file as it was; a key it holds with other values, or two
job folders give, is refused with a line naming the key and the rows (exit 1), and the file keeps what it holds. A
job that is not finished adds nothing; its row is added by the export after it finishes. A ``summary.json`` that
cannot be read is a job not finished, with one warning naming it. The arm is the value of the grid's first key, or
the job's overrides minus ``seed`` when no grid is given. ``sweeps/report.py`` reads a dotted column back as an
override.
"""

from __future__ import annotations

import argparse
import csv
import re
import shlex
import sys
from collections import Counter
from pathlib import Path

import yaml

SWEEPS = Path(__file__).resolve().parent
sys.path.insert(0, str(SWEEPS.parent / "src"))

from grpolab.app.run_folder import STATES, RunFolder  # noqa: E402
from grpolab.report.result_rows import cell, describe, duplicates, row_key  # noqa: E402
from grpolab.run_files import write_csv  # noqa: E402

COLUMNS = ("arm", "seed", "steps", "test_mean_at_16", "test_mean_at_16_se", "val_accuracy_start", "clip_mode",
           "async_generation", "drift_refreshes", "time_total_s", "learning_rate", "val_accuracy_end")
# the final eval's scores a job's summary.json holds: mean@n and its SE, greedy accuracy, pass@k
SCORE = re.compile(r"(test|val)_(mean_at_\d+(_se)?|greedy_accuracy|pass_at_\d+)")
ENTROPY_END, ENTROPY_STEPS = "train_entropy_end", 10  # the final entropy: metrics.csv's train/entropy, last steps


def config_grid(config: str, overrides: list[str]) -> dict[str, list[str]]:
    """The sweeper's ``params`` of ``sweeps/<config>.yaml`` (comma lists, as Hydra's basic sweeper reads them);
    an override ``key=a,b`` replaces a key's values, and so does a single value ``key=a`` of a key the params
    sweep (``algo.learning_rate=5e-5`` against the file's ``algo.learning_rate: 1e-4``), as Hydra's command line
    does: the command wins."""
    from hydra import compose, initialize_config_dir

    sweep = dict(o.split("=", 1) for o in overrides if "=" in o and "," in o.split("=", 1)[1])
    with initialize_config_dir(config_dir=str(SWEEPS), version_base="1.3"):
        conf = SWEEPS.parent / "conf"
        cfg = compose(config_name=config, overrides=[f"hydra.searchpath=[file://{conf}]",
                                                     *(o for o in overrides if o.split("=", 1)[0] not in sweep)],
                      return_hydra_config=True)
    params = {k: str(v).split(",") for k, v in (cfg.hydra.sweeper.params or {}).items()}
    single = {k: [v] for k, v in _as_dict(overrides).items() if k in params and k not in sweep}
    return {**params, **single, **{k: v.split(",") for k, v in sweep.items()}}


def expand(overrides: list[str]) -> list[dict[str, str]]:
    """Every job of a sweep's overrides (``key=a,b`` lists, ranges, choices), as Hydra's basic sweeper expands
    them: one ``{key: value}`` per job."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return [_as_dict(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def _as_dict(overrides: list[str]) -> dict[str, str]:
    return dict(o.split("=", 1) for o in overrides if "=" in o)


def find_jobs(sweep: Path) -> list[dict]:
    """Every job folder below ``sweep``: ``{"dir", "overrides" (dict), "status"}`` (:meth:`RunFolder.status`:
    the summary, and whether the job finished with every number it owes, ``trainer.max_steps`` and the final eval's
    score of its ``.hydra/config.yaml``), ``"state"`` and ``"steps"``."""
    jobs = []
    for path in sorted(sweep.rglob(".hydra/overrides.yaml")):
        job = path.parent.parent
        folder = RunFolder(job)
        status = folder.status()
        jobs.append({"dir": job, "overrides": _as_dict(yaml.safe_load(path.read_text()) or []), "status": status,
                     "state": folder.state(status), "steps": (status.summary or {}).get("steps")})
    return jobs


def rerun_command(multirun: Path) -> str:
    """The command that reruns the sweep of a ``multirun.yaml`` into its own folder (the same overrides, config,
    and launcher settings; ``hydra.sweep.dir`` = that folder)."""
    hydra = (yaml.safe_load(multirun.read_text()) or {})["hydra"]
    args = ["python", "src/train.py", "-m"]
    for source in hydra.get("runtime", {}).get("config_sources", []):
        if source.get("provider") == "command-line" and source.get("schema") == "file":
            args += ["--config-dir", source["path"]]
    if hydra.get("job", {}).get("config_name", "train") != "train":
        args += ["--config-name", hydra["job"]["config_name"]]
    kept = [o for o in hydra["overrides"]["hydra"] if not o.startswith(("hydra.sweep.dir=", "hydra.mode="))]
    args += [*hydra["overrides"]["task"], *kept, f"hydra.sweep.dir={multirun.parent}"]
    return " ".join(shlex.quote(a) for a in args)


def _matches(point: dict[str, str], overrides: dict[str, str]) -> bool:
    return all(overrides.get(k) == v for k, v in point.items())


def unnamed_keys() -> set[str]:
    """The override keys job folder names leave out (``conf/hydra/default.yaml``'s ``exclude_keys``:
    ``model.path``, ``data.path``, ...): two settings that differ only there share a folder name."""
    hydra = yaml.safe_load((SWEEPS.parent / "conf" / "hydra" / "default.yaml").read_text())
    return set(hydra["job"]["config"]["override_dirname"]["exclude_keys"])


def held_by_other_settings(point: dict[str, str], jobs: list[dict], swept: set[str] = frozenset()
                           ) -> tuple[dict, str] | None:
    """A grid point no folder holds whose folder name a job folder has, trained with other values of keys names
    leave out (a rerun with another ``model.path``): (that job, ``key=there (asked: value)`` ...); else None. A
    rerun of such a point is refused (``job not started``); it runs in a new ``hydra.sweep.dir``. A key the grid
    itself sweeps (``swept``: ``data.path=a,b``) tells jobs apart, not settings: a point differing there is a job of
    its own, not refused."""
    unnamed = unnamed_keys() - set(swept)
    named = {k: v for k, v in point.items() if k not in unnamed}
    for job in jobs:
        if {k: v for k, v in job["overrides"].items() if k not in unnamed} == named:  # the same folder name
            keys = sorted(k for k in (set(point) | set(job["overrides"])) & unnamed
                          if job["overrides"].get(k) != point.get(k))
            return job, ", ".join(f"{k}={job['overrides'].get(k, '(default)')} there, "
                                  f"{point.get(k, '(default)')} asked" for k in keys)
    return None


def swept_keys(jobs: list[dict[str, str]]) -> list[str]:
    """The keys whose value is not the same in every job (all keys for a single job), in first-seen order."""
    keys = list(dict.fromkeys(k for job in jobs for k in job))
    varying = [k for k in keys if len({job.get(k) for job in jobs}) > 1]
    return varying if varying or len(jobs) != 1 else keys


def arm_of(overrides: dict[str, str], first_key: str | None) -> str:
    """The arm of a job: the value of ``first_key`` (the grid's first key), else its overrides minus ``seed``."""
    if first_key:
        return overrides.get(first_key, "")
    return ",".join(f"{k}={v}" for k, v in sorted(overrides.items()) if k != "seed")


KEY = ("arm", "seed", "val_accuracy_start")  # a row is one (arm, seed) from one starting model, per grid values


def append_results(jobs: list[dict], first_key: str | None, out: Path, factors: list[str] = ()) -> tuple[int, list[str]]:
    """Append a row to ``out`` for every job that finished with every number it owes (``job["status"]``) and whose
    key (:data:`KEY` and the ``factors`` values) the file lacks: :data:`COLUMNS`, the job's final-eval scores
    (:data:`SCORE`: ``test_mean_at_16``, ``val_mean_at_16`` and their ``_se``, ``test_greedy_accuracy``,
    ``test_pass_at_<k>``), its final entropy (:data:`ENTROPY_END`) and one column per key of ``factors`` (the
    grid's other swept keys, e.g. ``algo.learning_rate``) with the job's override. Columns the file lacks are added
    (its older rows get blanks); a rerun of the export compares a key's rows on the file's columns only, so an
    older file's rows are not refused for lacking the new ones.

    A key the file holds already with the same values is skipped (a rerun of the export leaves the file as it
    was); one it holds with other values, a key two job folders give, and a key the file holds twice are refused:
    nothing is added or replaced for it, and one line names the key and its rows.

    Returns:
        (the number of rows added, one line per refused key).
    """
    rows, header = [], []
    if out.exists():
        with out.open(newline="") as fh:
            reader = csv.DictReader(fh)
            rows, header = list(reader), list(reader.fieldnames or [])
    # the warm start's floats differ between CPUs (its held-out accuracy at step 0, val_accuracy_start, tells them
    # apart), so a rerun on another machine is a key of its own, kept beside
    names = [*KEY, *factors]
    held: dict[tuple, list[tuple[str, dict]]] = {}
    for line, row in enumerate(rows, start=2):
        held.setdefault(row_key(row, names), []).append((f"{out.name} line {line}", row))
    found: dict[tuple, list[tuple[str, dict]]] = {}
    for job in jobs:
        status = job["status"]
        if not status.finished:
            continue
        summary = status.summary
        values = {f: job["overrides"].get(f, "") for f in factors}
        scores = {c: v for c, v in summary.items() if SCORE.fullmatch(c)}
        row = {"arm": arm_of(job["overrides"], first_key), **values,
               **{c: summary.get(c) for c in COLUMNS if c != "arm"}, **scores,
               # a run without the drift rule logs no count: it made no drift refresh (0, as its rows always said)
               "drift_refreshes": summary.get("drift_refreshes", 0),
               **({"ess_refreshes": summary["ess_refreshes"]} if "ess_refreshes" in summary else {}),
               ENTROPY_END: RunFolder(job["dir"]).train_tail_mean("train/entropy", ENTROPY_STEPS)}
        found.setdefault(row_key(row, names), []).append((f"job {job['dir']}", row))
    refused, added = [], 0
    for key in duplicates((k, place) for k, places in held.items() for place, _ in places):
        if key not in found:
            refused.append(f"refused {describe(names, key)}: {out.name} holds it {len(held[key])} times ("
                           + ", ".join(p for p, _ in held[key]) + "); each key is one row")
    for key, new in found.items():
        have = held.get(key, [])
        differ = _differences([r for _, r in have] + [r for _, r in new], header)
        if len(have) == 1 and not differ:
            continue  # the same row, written before
        if len(have) > 1 or differ:
            what = f"their values differ ({differ})" if differ else "each key is one row"
            refused.append(f"refused {describe(names, key)}: " + ", ".join(p for p, _ in [*have, *new])
                           + f"; {what}; the file keeps what it holds for it, nothing added")
            continue
        rows.append(new[0][1])
        added += 1
    if added or not out.exists():
        columns = list(dict.fromkeys([*(header or ["arm", *factors, *COLUMNS[1:]]), *(c for r in rows for c in r)]))
        write_csv(out, columns, rows)
    return added, refused


def _differences(rows: list[dict], header: list[str]) -> str:
    """Where the rows of one key differ (``steps 3 vs 10``), over the columns the file has (all, for a new file)
    and the rows hold: ``""`` when they agree."""
    columns = [c for c in dict.fromkeys(c for r in rows for c in r) if not header or c in header]
    out = []
    for c in columns:
        values = list(dict.fromkeys(cell(r.get(c)) for r in rows))
        if len(values) > 1:
            out.append(f"{c} " + " vs ".join(v or "''" for v in values))
    return ", ".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--config", help="a sweeps/<config>.yaml whose grid the folder should hold")
    parser.add_argument("--csv", type=Path, help="append the finished jobs' results to this CSV file")
    parser.add_argument("overrides", nargs="*", help="key=a,b: the grid (or overrides of --config's grid)")
    args = parser.parse_intermixed_args(argv)
    if not args.sweep.is_dir():
        parser.error(f"sweep: {args.sweep} is not a folder")
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        parser.error(f"{' '.join(bad)}: a grid is given as key=a,b (e.g. seed=0,1,2)")
    jobs = find_jobs(args.sweep)
    for job in jobs:  # a summary.json that cannot be read: the job counts as not finished, said once
        if job["status"].warning:
            print(f"sweep_status.py: warning: {job['status'].warning}", file=sys.stderr)
    if args.config and not (SWEEPS / f"{args.config}.yaml").exists():
        known = sorted(q.stem for q in SWEEPS.glob("*.yaml"))
        parser.error(f"--config {args.config}: no sweeps/{args.config}.yaml (the sweep configs: {', '.join(known)})")
    if args.config:
        grid = config_grid(args.config, args.overrides)
    else:
        grid = {k: v.split(",") for k, v in _as_dict(args.overrides).items()}
    first_key = next(iter(grid), None)
    points = expand([f"{k}={','.join(v)}" for k, v in grid.items()]) if grid else []
    multiruns = sorted(args.sweep.rglob("multirun.yaml"))
    if not grid:  # the grids the folder's multiruns were started with
        for multirun in multiruns:
            hydra = (yaml.safe_load(multirun.read_text()) or {})["hydra"]
            if "optuna" in str(hydra.get("sweeper", {}).get("_target_", "")):  # a search: no grid to expect
                continue
            params = [f"{k}={v}" for k, v in (hydra.get("sweeper", {}).get("params") or {}).items()]
            points += expand([*params, *hydra["overrides"]["task"]])
    missing = [p for p in points if not any(_matches(p, j["overrides"]) for j in jobs)]
    swept = {k for k in {k for p in points for k in p} if len({p.get(k) for p in points}) > 1}
    held = [(p, h) for p in missing if (h := held_by_other_settings(p, jobs, swept))]
    missing = [p for p in missing if not any(p is q for q, _ in held)]
    shown = list(grid) or swept_keys([j["overrides"] for j in jobs] + missing)
    for job in jobs:
        values = {k: job["overrides"].get(k, "") for k in shown}
        label = " ".join(f"{k}={v}" for k, v in values.items())
        print(f"{job['state']:<17} step {job['steps'] if job['steps'] is not None else '-':>5}  {label}  "
              f"({job['dir'].relative_to(args.sweep)})")
    for point in missing:
        print(f"{'not started':<17} step {'-':>5}  " + " ".join(f"{k}={point.get(k, '')}" for k in shown))
    for point, (job, keys) in held:
        print(f"{'refused':<17} step {'-':>5}  " + " ".join(f"{k}={point.get(k, '')}" for k in shown)
              + f"  (its folder {job['dir'].relative_to(args.sweep)} holds a run with other settings: {keys})")
    counts = Counter(j["state"] for j in jobs) + Counter({"not started": len(missing)})
    print(", ".join([f"{counts[s]} {s}" for s in STATES if counts[s]] + [f"{len(held)} refused"] * bool(held))
          or "no jobs")
    if held:
        print("a refused point is not run by a rerun into this folder (its folder holds a run with other settings, "
              "kept as it is): run those settings with a new hydra.sweep.dir")
    if any(j["state"] != "finished" for j in jobs) or missing:
        print("to finish, rerun into the same folder (finished jobs are skipped, interrupted ones resume):")
        for multirun in multiruns:
            print(f"  {rerun_command(multirun)}")
        if grid and missing:
            print(f"grid points no folder holds ({first_key} per line):")
            rest: dict[str, list[str]] = {}
            for point in missing:
                other = " ".join(f"{k}={v}" for k, v in point.items() if k != first_key)
                rest.setdefault(other, []).append(point[first_key])
            for other, values in rest.items():
                print(f"  {first_key}={','.join(values)} {other}".rstrip())
    if args.csv:
        factors = [k for k in grid if k not in (first_key, "seed")]
        added, refused = append_results(jobs, first_key, args.csv, factors)
        print("\n".join([*refused, f"{added} rows added to {args.csv}"]))
        return 1 if refused else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
