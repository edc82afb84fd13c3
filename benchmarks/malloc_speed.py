"""The speed cost of ``malloc_mmap_threshold`` (glibc's fixed mmap threshold), with and without, alternated.

    python benchmarks/malloc_speed.py                 # 2 rounds of: tiny default run, 0.5B-width bf16 step; each x2
    python benchmarks/malloc_speed.py --rounds 3

Each measurement is a fresh process, the two settings alternate within every round (same load for both):

* ``tiny``: the default run (``python src/train.py``: tiny model, arithmetic task, on-policy) for
  ``--tiny-steps`` steps without validation or checkpoints; steps/s over the steps after the first 10 (rollout +
  training seconds from ``metrics.csv``).
* ``0.5b``: forward + backward + AdamW of a ``--dtype`` Qwen2 at Qwen2.5-0.5B widths (hidden 896, intermediate
  4864, 14/2 heads) with ``--layers`` layers and a 1000-token vocabulary (the real 151,936-token head alone
  takes minutes per step in bf16 on a CPU without bf16 instructions), on 4 x ``--tokens`` tokens, one torch thread; wall and CPU seconds of
  the last of 3 steps, and the peak RSS (VmHWM).

CPU seconds (user + system, of the measured process only) are less sensitive than wall seconds to the other jobs
of a shared machine; the ``tiny`` run's CPU seconds cover the whole run (start-up included).

``null`` is glibc's dynamic threshold; ``--settings`` picks the fixed thresholds compared (bytes). Prints the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ("null", "131072", "4194304")

STEP = """
import json, sys, time, torch
from grpolab.app.malloc import set_mmap_threshold
set_mmap_threshold(None if sys.argv[1] == "null" else int(sys.argv[1]))
from transformers import Qwen2Config, Qwen2ForCausalLM
layers, tokens = int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
torch.set_num_threads(1)
cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=layers, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=1000, max_position_embeddings=512, tie_word_embeddings=True)
model = Qwen2ForCausalLM(cfg).to(getattr(torch, sys.argv[4])).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
ids = torch.randint(0, 1000, (4, tokens))
for _ in range(3):
    t0, c0 = time.perf_counter(), time.process_time()
    model(input_ids=ids).logits.float().log_softmax(-1).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    s, cpu = time.perf_counter() - t0, time.process_time() - c0
hwm = next(int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"s": s, "cpu_s": cpu, "hwm_mib": hwm}))
"""


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    e["PYTHONPATH"] = f"{ROOT / 'src'}{os.pathsep}{e.get('PYTHONPATH', '')}"
    return e


def tiny(setting: str, steps: int) -> tuple[float, float]:
    """Steps/s of the default run after its first 10 steps, and the whole run's CPU seconds (user + system)."""
    import pandas as pd

    with tempfile.TemporaryDirectory() as tmp:
        before = os.times()
        subprocess.run([sys.executable, "src/train.py", f"trainer.max_steps={steps}", f"hydra.run.dir={tmp}",
                        "trainer.val_check_interval=100000", "val.at_start=false", "save_policy=false",
                        "trainer.enable_progress_bar=false", "~callbacks.model_checkpoint",
                        f"malloc_mmap_threshold={setting}"], cwd=ROOT, env=env(), check=True, capture_output=True)
        after = os.times()
        cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
        m = pd.read_csv(Path(tmp) / "metrics.csv").dropna(subset=["train/step_time"]).reset_index(drop=True)
    first, last = m.iloc[9], m.iloc[-1]
    seconds = sum(float(last[k] - first[k]) for k in ("train/time/rollout", "train/time/train"))
    return (len(m) - 10) / seconds, cpu


def step(setting: str, layers: int, tokens: int, dtype: str) -> dict:
    out = subprocess.run([sys.executable, "-c", STEP, setting, str(layers), str(tokens), dtype], env=env(), check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), help="malloc_mmap_threshold values")
    parser.add_argument("--tiny-steps", type=int, default=110)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                        help="float32 where the CPU has no bf16 matmul (AVX2 only: bf16 runs at ~0.2 GFLOP/s)")
    args = parser.parse_args()
    res: dict[str, dict[str, list]] = {s: {"tiny_steps_s": [], "tiny_run_cpu_s": [], "step_s": [], "step_cpu_s": [], "hwm_mib": []}
                                     for s in args.settings}
    loads = [os.getloadavg()[0]]
    for r in range(args.rounds):
        for s in (args.settings if r % 2 == 0 else args.settings[::-1]):
            rate, cpu = tiny(s, args.tiny_steps)
            res[s]["tiny_steps_s"].append(round(rate, 2))
            res[s]["tiny_run_cpu_s"].append(round(cpu, 1))
            loads.append(os.getloadavg()[0])
            o = step(s, args.layers, args.tokens, args.dtype)
            res[s]["step_s"].append(round(o["s"], 2))
            res[s]["step_cpu_s"].append(round(o["cpu_s"], 2))
            res[s]["hwm_mib"].append(round(o["hwm_mib"]))
            loads.append(os.getloadavg()[0])
            print(f"round {r} threshold {s}: tiny {res[s]['tiny_steps_s'][-1]} steps/s ({res[s]['tiny_run_cpu_s'][-1]} CPU s), 0.5B-width {args.dtype} step "
                  f"{res[s]['step_s'][-1]} s ({res[s]['step_cpu_s'][-1]} CPU s), peak {res[s]['hwm_mib'][-1]} MiB, load {loads[-1]:.1f}",
                  flush=True)
    summary = {s: {k: statistics.median(v) for k, v in d.items()} for s, d in res.items()}
    print(json.dumps({"runs": res, "median": summary, "load_1min": [round(x, 1) for x in loads],
                      "time": time.strftime("%Y-%m-%d %H:%M")}, indent=1))


if __name__ == "__main__":
    main()
