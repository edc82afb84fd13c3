"""Which jobs of a sweep folder are done, and the command line for the rest.

A rerun of a Hydra sweep does not skip finished jobs, so a long screen (``sweeps/corrections_small.yaml``) is run
in batches into one folder: ``hydra.sweep.dir=$S/<batch>``. This script reads every job under ``$S`` (its
``.hydra/overrides.yaml`` and ``summary.json``) and prints, per (arm, seed), whether it finished (a
``summary.json`` that is not ``interrupted``), then the ``arm=... seed=...`` overrides that are still missing
from the sweep's grid::

    python sweeps/sweep_status.py multirun/corrections_small/<time> [--config corrections_small] [data=multistep]
    python sweeps/sweep_status.py $S --csv sweeps/results/corrections_small_default.csv   # keep the results

Extra ``key=value`` arguments are passed to the composition of the sweep (the grid itself). ``--csv`` appends one
row per finished job (:data:`COLUMNS`, from its ``summary.json``) to a results file, skipping the (arm, seed,
val_accuracy_start) rows it already holds: the record of a screen run over several days on machines that do not keep their folders.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import yaml

SWEEPS = Path(__file__).resolve().parent


def grid(config: str, overrides: list[str]) -> dict[str, list[str]]:
    """The sweeper's ``params`` of ``sweeps/<config>.yaml`` (comma lists, as Hydra's basic sweeper reads them);
    an override ``key=a,b`` of one of them replaces its values, as on the command line of a sweep."""
    from hydra import compose, initialize_config_dir

    sweep = dict(o.split("=", 1) for o in overrides if "=" in o and "," in o.split("=", 1)[1])
    with initialize_config_dir(config_dir=str(SWEEPS), version_base="1.3"):
        conf = SWEEPS.parent / "conf"
        cfg = compose(config_name=config, overrides=[f"hydra.searchpath=[file://{conf}]",
                                                     *(o for o in overrides if o.split("=", 1)[0] not in sweep)],
                      return_hydra_config=True)
    params = {k: str(v).split(",") for k, v in cfg.hydra.sweeper.params.items()}
    return {k: sweep[k].split(",") if k in sweep else v for k, v in params.items()}


def jobs(sweep: Path, keys: list[str]) -> dict[tuple[str, ...], str]:
    """(value of each key) -> ``done``, ``interrupted`` or ``running or failed``, for every job folder under
    ``sweep``; a finished job wins over an unfinished one with the same values."""
    out: dict[tuple[str, ...], str] = {}
    for path in sorted(sweep.rglob(".hydra/overrides.yaml")):
        job = path.parent.parent
        values = dict(o.split("=", 1) for o in yaml.safe_load(path.read_text()) or [] if "=" in o)
        key = tuple(values.get(k, "") for k in keys)
        summary = job / "summary.json"
        state = "running or failed"
        if summary.exists():
            state = "interrupted" if json.loads(summary.read_text()).get("interrupted") else "done"
        if out.get(key) != "done":
            out[key] = state
    return out


COLUMNS = ("arm", "seed", "steps", "test_mean_at_16", "test_mean_at_16_se", "val_accuracy_start", "clip_mode",
           "async_generation", "drift_refreshes", "time_total_s")


def append_results(sweep: Path, keys: list[str], out: Path) -> int:
    """Append a :data:`COLUMNS` row to ``out`` for every finished job under ``sweep`` whose (arm, seed, val_accuracy_start) it lacks
    (``arm`` is the value of the grid's first key). Returns the number of rows added."""
    rows = list(csv.DictReader(out.open())) if out.exists() else []
    # a row is one (arm, seed) from one starting model: the warm start's floats differ between CPUs (its held-out
    # accuracy at step 0, val_accuracy_start, tells them apart), so a rerun on another machine is kept beside it
    have = {(r["arm"], str(r["seed"]), str(r["val_accuracy_start"] or "")) for r in rows}
    added = 0
    for path in sorted(sweep.rglob(".hydra/overrides.yaml")):
        values = dict(o.split("=", 1) for o in yaml.safe_load(path.read_text()) or [] if "=" in o)
        summary_path = path.parent.parent / "summary.json"
        if not summary_path.exists():
            continue
        summary = json.loads(summary_path.read_text())
        arm, seed, start = values.get(keys[0], ""), str(summary.get("seed")), str(summary.get("val_accuracy_start") or "")
        if summary.get("interrupted") or (arm, seed, start) in have:
            continue
        rows.append({"arm": arm, **{c: summary.get(c) for c in COLUMNS if c != "arm"}})
        have.add((arm, seed, start))
        added += 1
    with out.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return added


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--config", default="corrections_small")
    parser.add_argument("--csv", type=Path, help="append the finished jobs' results to this CSV file")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_intermixed_args()
    params = grid(args.config, args.overrides)
    keys = list(params)
    found = jobs(args.sweep, keys)
    missing: dict[str, list[str]] = {}
    for key, state in sorted(found.items()):
        print(" ".join(f"{k}={v}" for k, v in zip(keys, key)), state)
    first, rest = keys[0], keys[1:]
    for value in params[first]:
        for other in _product([params[k] for k in rest]):
            if found.get((value, *other)) != "done":
                missing.setdefault(",".join(other), []).append(value)
    done = sum(s == "done" for s in found.values())
    print(f"{done} done; to run the rest:")
    for other, values in missing.items():
        print(f"  {first}={','.join(values)} " + " ".join(f"{k}={v}" for k, v in zip(rest, other.split(","))))
    if args.csv:
        print(f"{append_results(args.sweep, keys, args.csv)} rows added to {args.csv}")


def _product(lists: list[list[str]]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = [()]
    for values in lists:
        out = [(*o, v) for o in out for v in values]
    return out


if __name__ == "__main__":
    main()
