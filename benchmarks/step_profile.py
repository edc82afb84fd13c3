"""Where a GRPO step's time goes, and how close it is to the FLOP floor.

    python benchmarks/step_profile.py                        # default run and 48-token completions, 1 thread
    python benchmarks/step_profile.py --threads 2 --steps 30
    python benchmarks/step_profile.py --quick                # smoke run (random model, few steps)
    python benchmarks/step_profile.py --extra algo=grpo_offpolicy algo.shared_prompt_forward=false
    python benchmarks/step_profile.py --cases default --extra algo.shared_prompt_forward=false \
        rollout.drop_finished_rows=false          # the plain paths, for comparison (time and peak memory)

Runs the real training loop (``grpolab.app.run.build`` + ``trainer.fit``, validation off) and times each phase
by wrapping the functions that implement it: ``generate`` (the engine), ``reward`` (the verifier),
``logp passes`` (no-grad log-prob passes: sampler, reference, reference refresh, post-step lower bound), ``forward`` and ``backward`` of the
training step, ``optimizer`` (clip, step, weight check), ``metrics`` (``GRPOModule._log_step`` including
``log_dict``), and ``other`` (the rest of the step: Lightning's loop and loggers, batching, advantages,
decoding). Times are means per optimizer step over the steps after ``--warmup``.

The FLOP floor counts only tokens that must be computed: each distinct prompt once per group, real
completion tokens (up to the stop token), ``2 N`` FLOPs per token for a forward and ``6 N`` for forward +
backward, with ``N`` the non-embedding parameters plus the LM head (the attention's ``O(ctx)`` term is left
out). Achieved FLOP/s (floor / step time) is compared with a measured fp32 matmul peak of this machine.
"""

from __future__ import annotations

import argparse
import functools
import resource
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "default": [],
    "long48": ["model.warmstart=null", "algo.max_completion_length=48"],
}
PHASES = ("generate", "reward", "logp passes", "forward", "backward", "optimizer", "metrics", "other")


def matmul_peak(threads: int, n: int = 1024, repeats: int = 5) -> float:
    """Best fp32 FLOP/s of an ``n x n`` matmul with ``threads`` intra-op threads."""
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best


def flop_params(model: torch.nn.Module) -> int:
    """``N``: parameters a token's forward multiplies by (embedding lookups excluded, LM head included)."""
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    total = sum(p.numel() for p in model.parameters())
    return total - emb.numel() + (head.numel() if head is emb else 0)


def profile(case: str, extra: list[str], steps: int, warmup: int, threads: int) -> dict:
    import lightning as L
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    import grpolab.forward.theorem1 as theorem1_mod
    import grpolab.module as module_mod
    import grpolab.rollout.producer as producer_mod
    from grpolab.app.run import build

    torch.set_num_threads(threads)
    overrides = [*CASES[case], f"trainer.max_steps={steps}", "+trainer.limit_val_batches=0",
                 "trainer.enable_progress_bar=false", "val.at_start=false", "save_policy=false",
                 "~callbacks.model_checkpoint", *extra]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    out = ROOT / "benchmarks" / "results" / time.strftime(f"step_profile_{case}_%H-%M-%S")
    with open_dict(cfg):
        cfg.paths.output_dir = str(out)
    parts = build(cfg)
    trainer, module, dm = parts["trainer"], parts["module"], parts["datamodule"]
    spent: dict[str, float] = defaultdict(float)
    tokens: dict[str, float] = defaultdict(float)
    step_ends: list[float] = []
    snapshots: list[dict[str, float]] = []

    def timed(name, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t
        return wrapper

    def count_tokens(produce):
        @functools.wraps(produce)
        def wrapper(*args, **kwargs):
            mbs = produce(*args, **kwargs)
            passes = int(parts["algo"].reuses_samples) + int(module.reference is not None)
            for mb in mbs:
                first = torch.unique(mb.group_ids, return_inverse=True)[1]
                seen = set()
                distinct = sum(int(mb.prompt_mask[i].sum()) for i, g in enumerate(first.tolist())
                               if not (g in seen or seen.add(g)))
                completion = float(mb.completion_mask.sum())
                tokens["generate"] += distinct + completion
                tokens["train"] += (distinct + completion) * parts["algo"].num_iterations
                tokens["logp"] += (distinct + completion) * passes
                tokens["completion"] += completion
            return mbs
        return wrapper

    class Phases(L.Callback):
        def on_train_start(self, trainer, pl_module):
            producer = dm.producer
            producer.engine.generate = timed("generate", producer.engine.generate)
            producer.verifier = timed("reward", producer.verifier)
            producer.produce = count_tokens(producer.produce)
            opt = trainer.optimizers[0]
            opt.step = timed("optimizer", opt.step)
            step_ends.append(time.perf_counter())
            snapshots.append(dict(spent))

        def on_train_batch_end(self, *args, **kwargs):
            step_ends.append(time.perf_counter())
            snapshots.append(dict(spent) | {f"tokens/{k}": v for k, v in tokens.items()})

    for mod in (producer_mod, theorem1_mod):  # sampler and reference (also re-scored), post-step bound passes
        mod.batched_log_probs = timed("logp passes", mod.batched_log_probs)
    module_mod.completion_log_probs = timed("forward", module_mod.completion_log_probs)
    module.manual_backward = timed("backward", module.manual_backward)
    module._clip_and_check = timed("optimizer", module._clip_and_check)
    module._check_weights = timed("optimizer", module._check_weights)
    module._log_step = timed("metrics", module._log_step)
    trainer.callbacks.append(Phases())
    trainer.fit(module, datamodule=dm)

    n = len(step_ends) - 1 - warmup
    if n < 1:
        raise SystemExit(f"only {len(step_ends) - 1} steps ran; use --steps > --warmup")
    a, b = snapshots[warmup], snapshots[-1]
    per_step = {k: (b.get(k, 0.0) - a.get(k, 0.0)) / n for k in PHASES[:-1]}
    total = (step_ends[-1] - step_ends[warmup]) / n
    per_step["other"] = total - sum(per_step.values())
    tok = {k: (b.get(f"tokens/{k}", 0.0) - a.get(f"tokens/{k}", 0.0)) / n
           for k in ("generate", "train", "logp", "completion")}
    big_n = flop_params(module.policy)
    floor = 2 * big_n * tok["generate"] + 6 * big_n * tok["train"] + 2 * big_n * tok["logp"]
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    return {"case": case, "total": total, "phases": per_step, "tokens": tok, "N": big_n, "floor_flop": floor,
            "cuda_peak": peak}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--warmup", type=int, default=4, help="steps left out of the means")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="random model, 6 steps")
    p.add_argument("--extra", nargs="*", default=[], help="Hydra overrides for every case")
    a = p.parse_args()
    extra = list(a.extra)
    if a.quick:
        a.steps, a.warmup = 6, 2
        extra = ["model.warmstart=null", *extra]
    peak = matmul_peak(a.threads)
    print(f"fp32 matmul peak (1024^3, {a.threads} thread(s)): {peak / 1e9:.1f} GFLOP/s")
    for case in a.cases:
        r = profile(case, extra, a.steps, a.warmup, a.threads)
        print(f"\n== {case}: {r['total']:.3f} s/step (mean of steps {a.warmup + 1}..{a.steps}), "
              f"N = {r['N'] / 1e6:.2f}M FLOP-parameters")
        for k in PHASES:
            v = r["phases"][k]
            print(f"  {k:12s} {v * 1000:8.1f} ms  {100 * v / r['total']:5.1f}%")
        t = r["tokens"]
        achieved = r["floor_flop"] / r["total"]
        print(f"  tokens/step: generate {t['generate']:.0f} (completion {t['completion']:.0f}), "
              f"train {t['train']:.0f}, extra log-prob passes {t['logp']:.0f}")
        print(f"  FLOP floor {r['floor_flop'] / 1e9:.2f} GFLOP/step -> {achieved / 1e9:.2f} GFLOP/s achieved, "
              f"{100 * achieved / peak:.1f}% of the matmul peak")
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # process peak so far, MiB (Linux)
        cuda = f", CUDA peak {r['cuda_peak'] / 2**20:.0f} MiB" if r["cuda_peak"] is not None else ""
        print(f"  peak memory: process RSS {rss:.0f} MiB{cuda} (run one case per process to compare settings)")


if __name__ == "__main__":
    main()
