"""Optimizer steps per second and weight-sync time: on-policy (k=1), off-policy (k=10), off-policy k=10 async.

    python benchmarks/offpolicy_throughput.py                    # hf engine, 60 steps per arm (the real measurement)
    python benchmarks/offpolicy_throughput.py --quick            # tiny settings: checks that it runs end to end
    python benchmarks/offpolicy_throughput.py --engine vllm      # rollout=vllm for every arm (needs the vllm extra)
    python benchmarks/offpolicy_throughput.py --threads 2 --arms k1 k10   # the synchronous arms on 2 torch threads

Every arm does the same work per optimizer step: 128 completions (16 prompts x 8) of up to 48 tokens from a
random (not warm-started) tiny model made to stop rarely, so generation dominates as it does with long
reasoning completions. (A plain random char model stops after ~7 tokens: 1 of its 22 tokens is <eos>. The
benchmark saves the random model with its <eos> embedding zeroed and the others scaled by
--eos-suppression (default 4), which leaves P(<eos>) near 1e-3 a token: ~95% of completions run to 48 tokens;
0 keeps the plain random model. Truncated completions are scored by their text and the zero-variance mask is
off in every arm, so no reward teaches the model to stop early and every arm trains on all 128 rows.) The arms ending in _allcores run with torch on every core;
the others are pinned to one torch thread (k10_async: one per Python thread). k10_async_allcores is the default
async setting: trainer and sampler threads get half the cores each for the first half of each buffer's steps while
the next buffer is generated, then the trainer takes every core (rollout.overlap_steps). The "x" columns compare each arm with
k1_allcores (on-policy GRPO as a user runs it) when it is measured, else with k1. Each arm is the real CLI (`python src/train.py ...`) in its own folder under
benchmarks/results/offpolicy_throughput/<timestamp>/<arm>/; numbers come from its metrics.csv and summary.json:

* steps/s: optimizer steps per second from the fit start to the end of the last step (all steps), and in the
  steady state (from the end of step k-1: the first buffer, which every arm samples synchronously, is left out);
  use a number of steps that is a multiple of 10;
* weight sync: pushes to the sampler (`weight_syncs`) and their mean time (`train/time/weight_sync`);
* rollout s: time the trainer spent waiting for rollouts (with async, only the part not hidden by training).

The arm k10_async needs an engine that owns its weights: with --engine hf it uses rollout=hf_copy (a copy of
the policy refreshed by load_state_dict). The bar we set: k10_async_allcores >= 1.35x the steps/s of k1_allcores
(goal 2x). --precision bf16-mixed runs every arm under bf16 autocast (AMX matmuls on CPUs that have them).
Timings are only meaningful on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ARMS = {  # name -> Hydra overrides; "{copy}" is the engine that owns its weights
    "k1": ["algo=grpo_onpolicy", "rollout={engine}"],
    "k10": ["algo=grpo_offpolicy", "algo.steps_per_generation=10", "rollout={engine}"],
    "k10_async": ["algo=grpo_offpolicy", "algo.steps_per_generation=10", "rollout={copy}",
                  "rollout.async_generation=true"],
}
ARMS["k1_allcores"] = ARMS["k1"]
ARMS["k10_allcores"] = ARMS["k10"]
ARMS["k10_async_allcores"] = ARMS["k10_async"]
COPY_ENGINE = {"hf": "hf_copy", "vllm": "vllm"}  # the vLLM engine owns its weights already

WORK = ["algo.per_device_train_batch_size=128", "algo.num_generations=8", "algo.max_completion_length=48"]
QUICK_WORK = ["algo.per_device_train_batch_size=16", "algo.num_generations=4", "algo.max_completion_length=8",
              "model.hidden_size=32", "model.num_hidden_layers=2", "model.num_attention_heads=2",
              "model.num_key_value_heads=1", "model.intermediate_size=64"]
COMMON = ["model.warmstart=null", "model.max_position_embeddings=128", "algo.truncated_reward=null",
          "algo.mask_zero_std_groups=false",
          "val.at_start=false", "val.num_generations=1", "data.val_size=8", "data.test_size=8",
          "trainer.val_check_interval=100000", "save_policy=false", "trainer.enable_progress_bar=false",
          "~callbacks.completions", "callbacks.model_checkpoint.save_last=false",
          "callbacks.model_checkpoint.monitor=null"]


def arm_overrides(arm: str, engine: str, steps: int, threads: int | None, quick: bool) -> list[str]:
    """The Hydra overrides of one arm."""
    over = [o.format(engine=engine, copy=COPY_ENGINE[engine]) for o in ARMS[arm]]
    if quick:  # k=2 instead of 10 so a few steps still cover a refresh with a buffer in flight
        over = [o.replace("steps_per_generation=10", "steps_per_generation=2") for o in over]
    over += [*COMMON, *(QUICK_WORK if quick else WORK), f"trainer.max_steps={steps}"]
    if quick and engine == "vllm":  # vLLM's CPU attention rejects QUICK_WORK's head size of 16: one head of 32
        over += ["model.num_attention_heads=1", "model.num_key_value_heads=1"]
    if arm.endswith("_allcores"):
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if threads is not None:
        over += ["+callbacks.threads._target_=grpolab.callbacks.threads.TorchThreads",
                 f"+callbacks.threads.num_threads={threads}"]
    return over


def save_long_completion_model(folder: Path, scale: float) -> Path:
    """Save a random tiny char model that rarely samples <eos>: its (tied) <eos> embedding is zeroed and the
    other rows are multiplied by ``scale``, so <eos>'s logit sits far below the spread of the others."""
    import torch

    from grpolab.models import TinyCharModel

    spec = TinyCharModel(warmstart=None, max_position_embeddings=128)
    tok = spec.load_tokenizer()
    model = spec.load_policy(None)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb.mul_(scale)
        emb[tok.eos_token_id] = 0.0
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def measure(run_dir: Path, k: int) -> dict:
    """steps/s (all and steady state), weight syncs and their mean time, from a finished run folder."""
    import pandas as pd

    summary = json.loads((run_dir / "summary.json").read_text())
    m = pd.read_csv(run_dir / "metrics.csv").dropna(subset=["train/loss"]).reset_index(drop=True)
    elapsed = m["train/time/elapsed"]
    # steady state: from the end of step k-1 (the first buffer, sampled synchronously by every arm) to the end,
    # so the window holds whole buffers, refreshes included
    steady = m[m["step"] >= k - 1]
    steady_rate = (len(steady) - 1) / (steady["train/time/elapsed"].iloc[-1] - steady["train/time/elapsed"].iloc[0]) \
        if len(steady) > 1 else float("nan")
    syncs = m["train/time/weight_sync"][m["train/time/weight_sync"] > 0]
    return {"steps": len(m), "steps_per_s": len(m) / elapsed.iloc[-1], "steady_steps_per_s": steady_rate,
            "weight_syncs": summary["weight_syncs"], "sync_ms": 1000 * float(syncs.mean()) if len(syncs) else 0.0,
            "rollout_s": summary["time_rollout_s"], "train_s": summary["time_train_s"],
            "lag_max": int(m["train/lag/max"].iloc[-1]), "mean_length": float(m["train/completions/mean_length"].mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=sorted(COPY_ENGINE), default="hf")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per arm")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (TorchThreads callback; async splits the cores itself)")
    parser.add_argument("--quick", action="store_true", help="tiny model, 16 completions of up to 8 tokens, 6 steps")
    parser.add_argument("--eos-suppression", type=float, default=4.0,
                        help="embedding scale that makes the random model rarely stop (0 = the plain random model)")
    parser.add_argument("--precision", default=None,
                        help="trainer.precision for every arm, e.g. bf16-mixed (default: the config's 32-true)")
    parser.add_argument("--extra", nargs="*", default=[], help="extra Hydra overrides for every arm")
    args = parser.parse_args()
    steps = 6 if args.quick else args.steps
    if args.precision:
        args.extra = [f"trainer.precision={args.precision}", *args.extra]
    out = ROOT / "benchmarks" / "results" / "offpolicy_throughput" / time.strftime("%Y-%m-%d_%H-%M-%S")
    rows = {}
    if args.eos_suppression and not args.quick:
        folder = save_long_completion_model(out / "random_long_model", args.eos_suppression)
        args.extra = [f"model.path={folder}", *args.extra]
    for arm in args.arms:
        run_dir = out / arm
        over = arm_overrides(arm, args.engine, steps, args.threads, args.quick)
        cmd = [sys.executable, "src/train.py", *over, f"hydra.run.dir={run_dir}", *args.extra]
        print("+", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True)
        k = 1 if arm.startswith("k1_") or arm == "k1" else (2 if args.quick else 10)
        rows[arm] = measure(run_dir, k)
    base_name = "k1_allcores" if "k1_allcores" in rows else "k1"
    base = rows.get(base_name, {})
    print(f"\nengine={args.engine} threads={args.threads} precision={args.precision or 'config'} steps={steps} "
          f"(results in {out}); x = steps/s over {base_name}'s")
    print(f"{'arm':18s} {'steps/s':>8s} {'x':>6s} {'steady':>8s} {'x':>6s} {'syncs':>6s} {'sync ms':>8s} "
          f"{'rollout s':>9s} {'train s':>8s} {'lag max':>7s} {'mean len':>8s}")
    for arm, r in rows.items():
        x_all = r["steps_per_s"] / base["steps_per_s"] if base else float("nan")
        x_steady = r["steady_steps_per_s"] / base["steady_steps_per_s"] if base else float("nan")
        print(f"{arm:18s} {r['steps_per_s']:8.3f} {x_all:6.2f} {r['steady_steps_per_s']:8.3f} {x_steady:6.2f} "
              f"{r['weight_syncs']:6d} {r['sync_ms']:8.2f} {r['rollout_s']:9.1f} {r['train_s']:8.1f} {r['lag_max']:7d} "
              f"{r['mean_length']:8.1f}")
    (out / "results.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
