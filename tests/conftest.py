"""Shared test fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Under pytest-xdist (``-n auto``) each worker process gets one torch/OpenMP thread, before any test imports torch:
# the workers already fill the cores, and a second thread per worker only waits for a descheduled peer. Processes
# the tests start (train.py subprocesses, DDP ranks) inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
# The checkout under test, not whichever one `pip install -e .` points at: a clean-clone CI run (.ci/run) re-points
# the shared editable install at its clone, and the tests of this checkout then ran the clone's code.
sys.path.insert(0, str(REPO_ROOT / "src"))
KERNEL_PINS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def kernels_line() -> str:
    """Which processor and which kernels this run used (scripts/test_kernels.sh pins them to AVX2): a failure that
    only one kind of machine shows names its kernels in the log (pytest's header, and the last line under -q)."""
    import platform

    import torch

    model, isa = platform.processor() or "?", "?"
    try:
        info = Path("/proc/cpuinfo").read_text()
        model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), model)
        isa = "AVX-512" if " avx512f" in info else "AVX2" if " avx2" in info else "no AVX2"
    except OSError:
        pass
    pins = " ".join(f"{k}={os.environ[k]}" for k in KERNEL_PINS if k in os.environ) or "none"
    return f"cpu: {model} ({isa}); cpu kernels: ATen {torch.backends.cpu.get_cpu_capability()}, pinned: {pins}"


def _machine_cpu() -> tuple[float, float] | None:
    """(busy, all) core-seconds of the whole machine since boot, from /proc/stat; None where it cannot be read."""
    try:
        ticks = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - ticks[3] - ticks[4]) / hz, sum(ticks) / hz  # idle and iowait are not busy


_MACHINE_AT_START = pytest.StashKey()


def pytest_sessionstart(session):
    session.config.stash[_MACHINE_AT_START] = _machine_cpu()


def pytest_report_header(config):
    return kernels_line()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if config.get_verbosity() < 0:  # -q hides the header
        terminalreporter.write_line(kernels_line())
    start, end = config.stash.get(_MACHINE_AT_START, None), _machine_cpu()
    if start and end and end[1] > start[1]:  # how busy the machine was: a timing is quiet, or it is not
        busy, total = end[0] - start[0], end[1] - start[1]
        terminalreporter.write_line(f"machine: {os.cpu_count()} cores busy {100 * busy / total:.0f}% of the run "
                                    f"({busy:.0f} of {total:.0f} core-s, every process on it, this suite's and others')")


SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


def load_sweep_script(name: str):
    """``sweeps/<name>.py`` as a module (the sweeps folder is scripts, not a package), loaded once per process."""
    import importlib.util
    import sys

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "sweeps" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` (relative to the repository root): real public data, never copied into the repo."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder not found at {SHARED_DATA}")
    return SHARED_DATA


# ---------------------------------------------------------------------------------------- core fixtures
TINY_ARCH = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 intermediate_size=64, max_position_embeddings=64)

# Hydra overrides that make src/train.py run in seconds: a small random tiny model, short validation.
FAST_OVERRIDES = [
    "model.warmstart=null", "model.hidden_size=32", "model.num_hidden_layers=2", "model.num_attention_heads=2",
    "model.num_key_value_heads=1", "model.intermediate_size=64", "data.val_size=8", "data.test_size=16",
    "val.num_generations=2", "algo.num_generations=4", "algo.per_device_train_batch_size=8",
    "trainer.enable_progress_bar=false", "save_policy=true",
]


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory, worker_id) -> Path:
    """The real sweep command on a tiny grid, run once per test session and shared by every xdist worker (a file
    lock in the session's common temporary folder): ``sweeps/onoff_small.yaml`` with ``arm=k1,k2 seed=0,1``, 4 steps
    of a small random model, a validation every 2 steps and the final eval (2 samples). Read it, never change it:
    copy it first (tests/test_report.py, tests/test_sweeps_notebook.py)."""
    import forkrun
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    root = root.parent if worker_id != "master" else root  # xdist: <session>/popen-gwN -> <session>
    out, sweep = root / "tiny_sweep", root / "tiny_sweep" / "multirun"
    with FileLock(str(root / "tiny_sweep.lock")):
        if not (out / "done").exists():
            cmd = [sys.executable, "src/train.py", "--config-dir", "sweeps", "--config-name", "onoff_small",
                   "arm=k1,k2", "seed=0,1", *FAST_OVERRIDES, "save_policy=false", "trainer.max_steps=4",
                   "trainer.val_check_interval=2", f"hydra.sweep.dir={sweep}", f"paths.cache_dir={out / 'cache'}",
                   "final_eval.enabled=true", "final_eval.num_samples=2"]  # the claim table needs the test score
            env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline")
            proc = forkrun.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=env)
            assert proc.returncode == 0, proc.stderr[-3000:]
            (out / "done").write_text("")
    return sweep


@pytest.fixture
def tiny_spec():
    """A small random character-level Qwen2 model spec (no warm start)."""
    from grpolab.models import TinyCharModel

    return TinyCharModel(warmstart=None, **TINY_ARCH)


@pytest.fixture
def arithmetic_task():
    from grpolab.tasks.arithmetic import ArithmeticTask

    return ArithmeticTask(val_size=16, test_size=16, seed=0)


@pytest.fixture
def exact_reward():
    from grpolab.verifiers.exact import ExactMatchVerifier
    from grpolab.verifiers.reward import Verifier

    return Verifier({"exact": ExactMatchVerifier()})


def compose_train_cfg(output_dir: Path, overrides: list[str], config_name: str = "train", own_cache: bool = True):
    """Compose conf/<config_name>.yaml as src/train.py (or src/eval.py) would, with the run folder set to
    ``output_dir``; ``own_cache`` also points ``paths.cache_dir`` into it (False keeps conf/paths' user cache)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
        if own_cache:
            cfg.paths.cache_dir = str(output_dir / "cache")
    return cfg


def pytest_collection_modifyitems(config, items):
    """Run the files that hold ``slow`` tests first (stable order otherwise). With ``--dist loadfile`` and no
    reordering (pyproject's addopts) xdist hands out whole files in this order, so the long ones start at once
    instead of becoming the tail of the run."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


# GRPOLAB_TEST_CPU=<file>: append one JSON line per test with its CPU seconds (this process and the processes it
# waited for: train.py subprocesses, DDP ranks) and wall seconds. CPU time barely moves with the machine's load,
# so suite work can be compared on a busy machine: python tests/cpu_report.py <file>
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    out = os.environ.get("GRPOLAB_TEST_CPU")
    if not out:
        yield
        return
    import json
    import resource
    import time

    def cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    c0, t0 = cpu(), time.perf_counter()
    yield
    with open(out, "a") as fh:
        fh.write(json.dumps({"test": item.nodeid, "cpu_s": round(cpu() - c0, 2),
                             "wall_s": round(time.perf_counter() - t0, 2), "end": round(time.time(), 1),
                             "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}) + "\n")
