"""One ``src/train.py`` run in this process, with its CUDA peak memory beside the memory plan's number.

    python benchmarks/gpu_peak.py --name q05_onpolicy --out peaks.jsonl -- model=qwen0.5b trainer=gpu ...
    bash benchmarks/gpu_peak.sh [DATA_DIR]      # the three benchmarks/gpu_smoke.sh configs, one process each

Runs ``src/train.py`` in-process (``runpy``, so the CUDA counters are the run's own: start one process per run)
with the given Hydra overrides plus one callback, :class:`PeakMemory`, which only reads the counters (it resets
nothing). Afterwards one JSON line is appended to ``--out``::

    {run, exit, planned_GiB, peak_allocated_GiB, peak_reserved_GiB, plan_error_vs_allocated, ...}

* ``planned_GiB``: ``summary.json``'s ``memory_plan.peak_bytes`` (the plan the run logged before building
  anything, the same number ``+plan_only=true`` prints for the same overrides; composed from the overrides here
  when the run wrote no summary, ``plan_same_as_composed`` cross-checks the two); terms in ``plan_terms_GiB``.
* ``peak_allocated_GiB`` / ``peak_reserved_GiB``: ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``
  over the whole run (model build, rollouts, training steps, validation), device 0. Neither counts the CUDA
  context (a few hundred MiB outside the caching allocator).
* ``plan_error_vs_allocated``: ``planned / peak_allocated - 1`` (positive: the plan over-estimates).
* ``trace``: per training step, the allocated bytes and the running peak at the step's start (after its
  rollout, which the data loader runs before the step) and end (after backward and the optimizer step), in GiB,
  and the allocated bytes at ``fit`` start (weights, reference model, sampler copy; no optimizer state yet).

CPU-safe: without CUDA the memory fields are null (the run itself still needs its own ``trainer=`` to match).
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30

TRACE: list[dict[str, Any]] = []  # filled by PeakMemory in the module ``gpu_peak`` (the callback's import name)


def _cuda() -> Any:
    import torch

    return torch.cuda if torch.cuda.is_available() else None


def _gib(n: int | None) -> float | None:
    return None if n is None else round(n / GIB, 3)


class PeakMemory(L.Callback):
    """Record CUDA allocated / running-peak bytes at fit start and at each training step's start and end."""

    def _mark(self, where: str, step: int) -> None:
        cuda = _cuda()
        if cuda is None:
            return
        TRACE.append({"where": where, "step": step, "allocated_GiB": _gib(cuda.memory_allocated()),
                      "peak_allocated_GiB": _gib(cuda.max_memory_allocated()),
                      "peak_reserved_GiB": _gib(cuda.max_memory_reserved())})

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._mark("fit_start", trainer.global_step)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._mark("step_start", trainer.global_step)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._mark("step_end", trainer.global_step)


def _run_dir(overrides: list[str]) -> Path:
    for o in overrides:
        if o.startswith("hydra.run.dir="):
            return Path(o.split("=", 1)[1])
    raise SystemExit("gpu_peak.py: pass hydra.run.dir=... among the overrides (summary.json is read from it)")


def plan_of(overrides: list[str]) -> dict[str, Any] | None:
    """The memory plan of ``overrides`` (``summary.json``'s ``memory_plan``, what ``+plan_only=true`` prints),
    composed here without running anything; ``hydra.*`` overrides are left out."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    sys.path.insert(0, str(ROOT / "src"))
    from grpolab.app.plan_from_config import plan_summary

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[o for o in overrides if not o.startswith("hydra.")])
    GlobalHydra.instance().clear()
    return plan_summary(cfg)


def run(name: str, overrides: list[str]) -> dict[str, Any]:
    """Run ``src/train.py`` with ``overrides`` in this process; return the record (see the module docstring)."""
    run_dir = _run_dir(overrides)
    composed = plan_of(overrides)  # before the run: a run that fails early still gets its plan
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the callback's target: gpu_peak.PeakMemory
    import gpu_peak  # the same file under its import name: its TRACE is the one the callback fills

    argv = [str(ROOT / "src" / "train.py"), *overrides, "+callbacks.gpu_peak._target_=gpu_peak.PeakMemory"]
    saved, sys.argv = sys.argv, argv
    start, code = time.perf_counter(), 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
    except Exception as err:  # noqa: BLE001 - recorded, the record is still written
        code = f"{type(err).__name__}: {err}"[:500]
    finally:
        sys.argv = saved
    wall = time.perf_counter() - start

    import torch

    cuda = _cuda()
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    plan = summary.get("memory_plan") or composed or {}
    planned = plan.get("peak_bytes")
    alloc = cuda.max_memory_allocated() if cuda else None
    reserved = cuda.max_memory_reserved() if cuda else None
    return {
        "run": name, "exit": code, "wall_s": round(wall, 1), "steps": summary.get("steps"),
        "interrupted": summary.get("interrupted"),
        "planned_GiB": _gib(planned), "peak_allocated_GiB": _gib(alloc), "peak_reserved_GiB": _gib(reserved),
        "plan_error_vs_allocated": round(planned / alloc - 1, 3) if planned and alloc else None,
        "plan_error_vs_reserved": round(planned / reserved - 1, 3) if planned and reserved else None,
        "plan_same_as_composed": (summary.get("memory_plan") or {}).get("peak_bytes") == (composed or {}).get(
            "peak_bytes") if summary.get("memory_plan") else None,
        "plan_terms_GiB": {k: _gib(v) for k, v in (plan.get("terms_bytes") or {}).items()},
        "plan_available_GiB": _gib(plan.get("available_bytes")),
        "device": torch.cuda.get_device_name(0) if cuda else None,
        "device_total_GiB": _gib(torch.cuda.get_device_properties(0).total_memory) if cuda else None,
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "overrides": overrides, "trace": list(gpu_peak.TRACE),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", required=True, help="the run's name in the record")
    p.add_argument("--out", required=True, type=Path, help="a JSON-lines file; one record is appended")
    p.add_argument("overrides", nargs="+", help="src/train.py's Hydra overrides (after --), hydra.run.dir among them")
    args = p.parse_args()
    record = run(args.name, args.overrides)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        f.write(json.dumps(record) + "\n")
    brief = {k: record[k] for k in ("run", "exit", "wall_s", "steps", "planned_GiB", "peak_allocated_GiB",
                                    "peak_reserved_GiB", "plan_error_vs_allocated")}
    print("gpu_peak:", json.dumps(brief), flush=True)


if __name__ == "__main__":
    main()
