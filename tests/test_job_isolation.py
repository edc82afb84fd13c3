"""Jobs of one Hydra multirun share a process: ``torch_threads`` and ``malloc_mmap_threshold`` (what every job's
entry sets: grpolab.app.run.build, src/train.py) must not carry over from one job to the next."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from grpolab.app.malloc import _glibc
from grpolab.callbacks.threads import ORIGINAL_THREADS, apply_torch_threads

SRC = Path(__file__).resolve().parents[1] / "src"
TINY, OTHER = "grpolab.models.TinyCharModel", "grpolab.models.PretrainedModel"


def test_torch_threads_of_a_job_do_not_depend_on_the_job_before():
    start = torch.get_num_threads()
    try:
        assert apply_torch_threads(ORIGINAL_THREADS + 1, TINY) == ORIGINAL_THREADS + 1  # an earlier job's count
        assert apply_torch_threads("auto", OTHER) == ORIGINAL_THREADS  # torch's default, as if it ran alone
        assert apply_torch_threads("auto", TINY) == 1
        assert apply_torch_threads(None, TINY) == ORIGINAL_THREADS
    finally:
        torch.set_num_threads(start)


# Each case in a fresh process (glibc's threshold cannot be unset in-process), jobs one after another as in a multirun
JOBS = """
import json, logging, os, sys
from grpolab.app.malloc import apply_config
logging.basicConfig(level=logging.WARNING)
out = []
for job in json.loads(sys.argv[1]):
    out.append({"fixed": apply_config(job), "env": os.environ.get("MALLOC_MMAP_THRESHOLD_")})
print(json.dumps(out))
"""
FIXED = {"model": {"_target_": TINY}, "malloc_mmap_threshold": 262144}
AUTO_NULL = {"model": {"_target_": TINY}, "malloc_mmap_threshold": "auto"}  # the tiny model: glibc's dynamic one


def _run(*jobs, start_env: str | None = None) -> tuple[list[dict], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["PYTHONPATH"] = f"{SRC}{os.pathsep}{env.get('PYTHONPATH', '')}"
    if start_env is not None:
        env["MALLOC_MMAP_THRESHOLD_"] = start_env
    out = subprocess.run([sys.executable, "-c", JOBS, json.dumps(jobs)], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_the_mmap_threshold_children_get_is_the_jobs_own():
    glibc = _glibc() is not None
    alone, _ = _run(AUTO_NULL)
    assert alone == [{"fixed": False, "env": None}]
    jobs, log = _run(FIXED, AUTO_NULL)
    assert jobs[0] == {"fixed": glibc, "env": "262144" if glibc else None}
    assert jobs[1] == alone[0]  # DDP ranks / vLLM servers of the second job start as if it ran alone
    if glibc:  # glibc cannot turn its dynamic threshold back on in-process: said, not hidden
        assert "an earlier job of this process (a multirun) fixed it at 262144 bytes" in log
    exported, _ = _run(FIXED, AUTO_NULL, start_env="65536")  # a value the user exported stays the children's
    assert [j["env"] for j in exported] == ["65536", "65536"]
