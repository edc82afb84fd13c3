"""malloc_mmap_threshold: glibc's mmap threshold is fixed at start-up, so freed blocks go back to the OS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpolab.app.malloc import _glibc, check_mmap_threshold, set_mmap_threshold
from grpolab.errors import ConfigError

SRC = Path(__file__).resolve().parents[1] / "src"

# Frees an 8 MiB mapped block (glibc's dynamic threshold then rises to 8 MiB), then allocates, touches and frees
# 24 blocks of 2 MiB (each followed by a live 64 KiB chunk): from the heap under the dynamic threshold (they stay resident), mapped and returned when fixed.
PROBE = """
import ctypes, json, sys
from grpolab.app.malloc import set_mmap_threshold
def rss():
    return next(int(l.split()[1]) // 1024 for l in open("/proc/self/status") if l.startswith("VmRSS:"))
fixed = set_mmap_threshold(None if sys.argv[1] == "null" else int(sys.argv[1]))
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
big = libc.malloc(8 << 20); ctypes.memset(big, 1, 8 << 20); libc.free(big)
before = rss()
blocks, pins = [], []
for _ in range(24):  # each block followed by a live 64 KiB heap chunk, so freed blocks cannot merge into the top
    blocks.append(libc.malloc(2 << 20))
    ctypes.memset(blocks[-1], 1, 2 << 20)
    pins.append(libc.malloc(64 << 10))
for b in blocks:
    libc.free(b)
import os
print(json.dumps({"fixed": fixed, "kept_mib": rss() - before, "env": os.environ.get("MALLOC_MMAP_THRESHOLD_")}))
"""


def run_probe(setting: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["PYTHONPATH"] = f"{SRC}{os.pathsep}{env.get('PYTHONPATH', '')}"
    out = subprocess.run([sys.executable, "-c", PROBE, setting], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_setting_is_validated():
    assert check_mmap_threshold(None) is None and check_mmap_threshold(131072) == 131072
    for bad in (-1, 64 << 20, "128k", 1.5, True):
        with pytest.raises(ConfigError, match="malloc_mmap_threshold"):
            check_mmap_threshold(bad)
    assert set_mmap_threshold(None) is False  # null: glibc's default, nothing changed
    # auto: the embedded tiny models keep glibc's default (speed), any other model gets a fixed threshold (memory)
    assert check_mmap_threshold("auto", "grpolab.models.TinyCharModel") is None
    assert check_mmap_threshold("auto", "grpolab.models.PretrainedModel") == 131072
    assert check_mmap_threshold("auto", None) == 131072
    assert set_mmap_threshold("auto", "grpolab.models.TinyQwenModel") is False


@pytest.mark.skipif(_glibc() is None, reason="glibc only (elsewhere the setting is a no-op)")
def test_fixed_threshold_returns_freed_blocks_and_reaches_children():
    dynamic, fixed = run_probe("null"), run_probe("131072")
    assert dynamic["fixed"] is False and dynamic["env"] is None
    assert fixed["fixed"] is True and fixed["env"] == "131072"  # exported: DDP ranks and vLLM processes inherit it
    assert dynamic["kept_mib"] >= 40, dynamic  # 48 MiB freed but resident in the heap
    assert fixed["kept_mib"] <= 8, fixed       # mapped blocks go back to the OS on free
