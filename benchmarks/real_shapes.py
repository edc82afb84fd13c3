"""A few GRPO steps at the real Qwen2.5 shapes (random weights), each row in a fresh process: peak RSS against
the memory plan, seconds per step, generation and training tokens/s, and their fraction of the matmul peak.

    python benchmarks/real_shapes.py                         # every row (minutes each on a 2-core CPU)
    python benchmarks/real_shapes.py --rows 0.5b_fp32_hf 0.5b_bf16_hf
    python benchmarks/real_shapes.py --rows 0.5b_bf16_vllm --python ~/.cache/grpolab/venv-vllm/bin/python
    python benchmarks/real_shapes.py --matmul-only           # the matmul peak alone
    python benchmarks/real_shapes.py --quick --rows 0.5b_fp32_hf   # one decoder layer: checks the script
    python benchmarks/real_shapes.py --rows 0.5b_fp32_hf --extra malloc_mmap_threshold=null   # glibc's default

Not CI. Every row is ``src/train.py`` with ``model.init=random`` (the ``config.json`` shapes of
``conf/model/qwen*.yaml``), the real Qwen2.5 tokenizer and chat template and GSM8K prompts from
``../shared/data``; nothing is downloaded. Per row (the LAST step is timed, the first ones warm up):

* ``peak_MiB``: the largest peak resident set of any process of the run (the kernel's high-water mark from
  ``os.wait4``, which covers the run's own children: a DDP rank or a vLLM engine core); ``plan_MiB``: the
  plan's ``peak_bytes`` per process from ``summary.json``; ``plan_error``: plan / measured - 1.
* ``s_per_step``: wall seconds of the last optimizer step (``train/step_time`` plus that step's rollout).
* ``gen_tok_s``: completion tokens of the last step / its rollout seconds (generation plus the sampler's
  log-prob pass and scoring: a lower bound on decode speed; None for the async row, whose generation runs
  beside training and is not timed per step). ``train_tok_s``: prompt + completion tokens of the
  last step / its training seconds (forward, backward, optimizer).
* ``gen_peak_frac`` / ``train_peak_frac``: model FLOP/s over the measured matmul peak of the row's dtype.
  FLOPs counted: 2 N per generated token (N = matmul parameters, the tied head included, attention scores
  left out); training 6 N per token for full fine-tuning, 4 N with LoRA (no weight gradients of the base),
  plus 2 N with gradient checkpointing (the recomputed forward).

Timings depend on the machine's load (it is recorded per row with ``os.getloadavg``); memory peaks do not.
Results: stdout and ``benchmarks/results/real_shapes_<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
MIB = 1 << 20

COMMON = [
    "data=gsm8k", f"data.path={DATA / 'gsm8k' / 'train.jsonl'}", f"data.test_path={DATA / 'gsm8k' / 'test.jsonl'}",
    "data.val_size=2", "verifier=gsm8k", f"model.tokenizer_path={DATA / 'qwen2.5-tokenizer'}", "model.init=random",
    "algo.num_generations=2", "algo.per_device_train_batch_size=4", "algo.max_completion_length=32",
    "algo.truncated_reward=-1.0", "plan.prompt_length=160", "trainer.val_check_interval=100000",
    "trainer.enable_progress_bar=false", "val.at_start=false", "save_policy=false",
    "~callbacks.model_checkpoint", "~callbacks.completions",
]
FP32 = ["model.dtype=float32", "trainer.precision=32-true"]
BF16 = ["model.dtype=bfloat16", "trainer.precision=32-true"]
NO_CKPT = ["model.gradient_checkpointing=false"]
ROWS = {
    "0.5b_fp32_hf": ["model=qwen0.5b", *FP32, *NO_CKPT, "rollout=hf"],
    "0.5b_bf16_hf": ["model=qwen0.5b", *BF16, *NO_CKPT, "rollout=hf"],
    "0.5b_fp32_vllm": ["model=qwen0.5b", *FP32, *NO_CKPT, "rollout=vllm"],
    "0.5b_bf16_vllm": ["model=qwen0.5b", *BF16, *NO_CKPT, "rollout=vllm"],
    "0.5b_bf16_ddp2": ["model=qwen0.5b", *BF16, *NO_CKPT, "rollout=hf", "trainer=ddp", "trainer.devices=2"],
    "0.5b_fp32_ddp2": ["model=qwen0.5b", *FP32, *NO_CKPT, "rollout=hf", "trainer=ddp", "trainer.devices=2"],
    "0.5b_fp32_async": ["model=qwen0.5b", *FP32, *NO_CKPT, "rollout=hf", "algo=grpo_offpolicy",
                        "algo.steps_per_generation=1", "rollout.async_generation=true"],
    "1.5b_lora16_bf16_ckpt": ["model=qwen1.5b", *BF16, "model.gradient_checkpointing=true", "model.lora.r=16",
                              "rollout=hf"],
    "1.5b_lora16_fp32_ckpt": ["model=qwen1.5b", *FP32, "model.gradient_checkpointing=true", "model.lora.r=16",
                              "rollout=hf"],
    "0.5b_bf16_async": ["model=qwen0.5b", *BF16, *NO_CKPT, "rollout=hf", "algo=grpo_offpolicy",
                        "algo.steps_per_generation=1", "rollout.async_generation=true"],
}
VLLM_ROWS = {"0.5b_fp32_vllm", "0.5b_bf16_vllm"}


def matmul_peak(dtype_name: str, m: int, k: int, n: int, backward: bool = False, seconds: float = 2.0) -> float:
    """Best FLOP/s of ``torch.nn.functional.linear`` from ``(m, k)`` to ``(m, n)`` in ``dtype_name``
    (``float32`` | ``bfloat16``) over ``seconds``: the layout ``nn.Linear`` runs (``x @ W.T``, ``W`` of shape
    ``(n, k)``). With ``backward`` the forward and both gradients (3 matmuls: ``6 m k n`` FLOPs) are timed together.

    The layout matters: on a CPU without bf16 instructions (AVX2) torch 2.13 runs a bf16 ``x @ W.T`` at ~10
    GFLOP/s but ``a @ b`` with both operands row-major (the input gradient ``g @ W``) at ~1, so a plain ``a @ b``
    under-states the forward and over-states the backward."""
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, dtype_name)
    x = torch.randn(m, k, dtype=dtype, requires_grad=backward)
    w = torch.randn(n, k, dtype=dtype, requires_grad=backward)
    grad = torch.randn(m, n, dtype=dtype)

    def step() -> None:
        y = F.linear(x, w)
        if backward:
            y.backward(grad)

    for _ in range(2):
        step()
    flops = 2 * m * k * n * (3 if backward else 1)
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        step()
        best = max(best, flops / (time.perf_counter() - t0))
    return best


def measure_peaks() -> dict[str, float]:
    """Linear-layer FLOP/s at the 0.5B model's MLP shape (896 -> 4864): forward + backward on 512 training tokens
    (``<dtype>_train``) and the forward of a 4-row decode (``<dtype>_decode``)."""
    out = {}
    for dtype in ("float32", "bfloat16"):
        out[f"{dtype}_train"] = matmul_peak(dtype, 512, 896, 4864, backward=True)
        out[f"{dtype}_decode"] = matmul_peak(dtype, 4, 896, 4864)
    return out


def matmul_params(arch: dict) -> int:
    """Parameters that a token's forward multiplies by: every projection and the head (the embedding lookup is
    not a matmul; a tied head still is)."""
    h, i, layers, v = arch["hidden_size"], arch["intermediate_size"], arch["num_hidden_layers"], arch["vocab_size"]
    kv = arch["num_key_value_heads"] * (h // arch["num_attention_heads"])
    return layers * (2 * h * h + 2 * h * kv + 3 * h * i) + v * h


QUICK = ["model.architecture.num_hidden_layers=1", "algo.max_completion_length=8"]


def run_row(name: str, python: str, steps: int, out: Path, quick: bool = False, extra: tuple[str, ...] = ()) -> dict:
    """Run one row in a fresh process; return its measurements (see the module docstring)."""
    import pandas as pd
    import psutil
    from omegaconf import OmegaConf

    overrides = [*COMMON, *ROWS[name], *(QUICK if quick else []), *extra, f"trainer.max_steps={steps}",
                 f"hydra.run.dir={out}"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.Popen([python, "src/train.py", *overrides], cwd=ROOT, env=env,
                            stdout=open(out.parent / f"{out.name}.log", "w"), stderr=subprocess.STDOUT)
    tree_peak, usage = 0, None
    while usage is None:  # the whole tree's RSS, sampled; the per-process high-water mark comes from wait4
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            usage, proc.returncode = rusage, os.waitstatus_to_exitcode(status)
            break
        try:
            p = psutil.Process(proc.pid)
            tree_peak = max(tree_peak, sum(c.memory_info().rss for c in [p, *p.children(recursive=True)]))
        except psutil.Error:
            pass
        time.sleep(0.25)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not (out / "summary.json").exists():
        raise RuntimeError(f"row {name} failed: see {out.with_suffix('.log')}")
    for ckpt in out.rglob("*.ckpt"):  # last.ckpt is saved (its memory is part of the row) but not kept: GBs each
        ckpt.unlink()
    summary = json.loads((out / "summary.json").read_text())
    cfg = OmegaConf.load(out / ".hydra" / "config.yaml")
    metrics = pd.read_csv(out / "metrics.csv").dropna(subset=["train/step_time"]).reset_index(drop=True)
    last, prev = metrics.iloc[-1], (metrics.iloc[-2] if len(metrics) > 1 else None)

    def delta(key: str) -> float:
        return float(last[key] - (prev[key] if prev is not None else 0.0))

    rollout_s, train_s = delta("train/time/rollout"), delta("train/time/train")
    rows = int(cfg.algo.per_device_train_batch_size)
    gen_tokens = float(last["train/completions/mean_length"]) * rows
    train_tokens = delta("train/num_tokens")
    n = matmul_params(OmegaConf.to_container(cfg.model.architecture))
    lora, ckpt = cfg.model.lora.r is not None, bool(cfg.model.gradient_checkpointing)
    train_flops = train_tokens * n * ((4 if lora else 6) + (2 if ckpt else 0))
    plan = summary["memory_plan"]
    peak = usage.ru_maxrss * 1024
    return {"row": name, "dtype": str(cfg.model.dtype), "steps": steps, "wall_s": round(wall, 1),
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
            "peak_MiB": round(peak / MIB), "tree_peak_MiB": round(tree_peak / MIB),
            "plan_MiB": round(plan["peak_bytes"] / MIB), "plan_error": round(plan["peak_bytes"] / peak - 1, 3),
            "plan_terms_MiB": {k: round(v / MIB) for k, v in plan["terms_bytes"].items()},
            "s_per_step": round(float(last["train/step_time"]) + rollout_s, 2), "rollout_s": round(rollout_s, 2),
            "train_s": round(train_s, 2), "gen_tokens": gen_tokens, "train_tokens": train_tokens,
            "gen_tok_s": round(gen_tokens / rollout_s, 2) if rollout_s > 1e-3 else None,  # async: not in the step
            "train_tok_s": round(train_tokens / max(train_s, 1e-9), 2),
            "gen_flop_s": 2 * n * gen_tokens / rollout_s if rollout_s > 1e-3 else None,
            "train_flop_s": train_flops / max(train_s, 1e-9)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--steps", type=int, default=2, help="GRPO steps per row (the last one is timed)")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the rows")
    parser.add_argument("--vllm-python", default=str(Path.home() / ".cache/grpolab/venv-vllm/bin/python"),
                        help="interpreter for the rollout=vllm rows (an environment with vLLM)")
    parser.add_argument("--matmul-only", action="store_true")
    parser.add_argument("--quick", action="store_true", help="one decoder layer, 8 tokens: checks the script")
    parser.add_argument("--extra", nargs="*", default=[], help="Hydra overrides added to every row, e.g. "
                        "malloc_mmap_threshold=null (glibc's dynamic default)")
    args = parser.parse_args()
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    base = ROOT / "benchmarks" / "results" / f"real_shapes_{stamp}"
    base.mkdir(parents=True, exist_ok=True)
    peaks = measure_peaks()
    print("matmul peak GFLOP/s:", {k: round(v / 1e9, 1) for k, v in peaks.items()}, "load", os.getloadavg(),
          flush=True)
    machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    try:
        machine["cpu"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                              if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    results = []
    for name in ([] if args.matmul_only else args.rows):
        python = args.vllm_python if name in VLLM_ROWS else args.python
        row = run_row(name, python, args.steps, base / name, args.quick, tuple(args.extra))
        row["extra"] = list(args.extra)
        kind = "bfloat16" if row["dtype"] == "bfloat16" else "float32"
        row["gen_peak_frac"] = round(row["gen_flop_s"] / peaks[f"{kind}_decode"], 3) if row["gen_flop_s"] else None
        row["train_peak_frac"] = round(row["train_flop_s"] / peaks[f"{kind}_train"], 3)
        results.append(row)
        print(json.dumps(row), flush=True)
        Path(f"{base}.json").write_text(json.dumps({"machine": machine, "matmul_peak_flop_s": peaks,
                                                    "rows": results}, indent=2))
    print(f"\nmachine: {machine}")
    print("| row | peak MiB | plan MiB | plan error | s/step | gen tok/s | train tok/s | gen % peak | train % peak "
          "| load (1 min) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['row']} | {r['peak_MiB']} | {r['plan_MiB']} | {r['plan_error']:+.1%} | {r['s_per_step']} | "
              f"{r['gen_tok_s'] or '-'} | {r['train_tok_s']} | {r['gen_peak_frac'] or 0:.1%} | {r['train_peak_frac']:.1%} | "
              f"{r['load_before'][0]}-{r['load_after'][0]} |")


if __name__ == "__main__":
    main()
