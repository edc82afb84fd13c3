"""The sampler as a vLLM server (rollout=vllm_server): weight-push cost against model size, and optimizer steps per
second against the in-process rollout=vllm at the same work. Run in the environment with the vllm extra:

    python benchmarks/sampler_server.py                      # both parts (CPU: ~20-30 min on a 2-core machine)
    python benchmarks/sampler_server.py --part push          # push seconds and bytes/s: tiny, ~100M, ~500M
    python benchmarks/sampler_server.py --part steps --steps 20

Part ``push``: for each model, an engine starts a server (pinned to core 0) on the random-weight model, then pushes
the weights ``--pushes`` times (:class:`~grpolab.rollout.engines.vllm_server.transport.FilePush` on CPU: a safetensors file in
/dev/shm that the server reloads); reported: bytes per push, seconds per push (mean after the start-up load),
split into writing the file and the server's pause + reload + relabel, and bytes/s. Models: the tiny char model
(float32); "~100M": Qwen2.5-0.5B's layer shapes (hidden 896, 14/2 heads, MLP 4864) with 5 layers and a 32000
vocabulary (bfloat16); "~500M": Qwen2.5-0.5B's config.json (494M parameters, bfloat16). Random weights, no download.

Part ``steps``: the arms of benchmarks/offpolicy_throughput.py (128 completions of up to 48 tokens per step from a
random tiny model that rarely stops), each the real CLI: k=1, k=10 and k=10 async with the server on core 0 and
the trainer pinned to core 1 (``taskset -c 1``, one torch thread), against rollout=vllm in process on both
cores. Steady steps/s leaves out the first buffer (and with it the server's start). Results go under
benchmarks/results/sampler_server/<timestamp>/. Timings only mean something on an otherwise idle machine: the
load average is printed with them.
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
sys.path.insert(0, str(ROOT / "benchmarks"))
from offpolicy_throughput import COMMON, WORK, measure, save_long_completion_model  # noqa: E402

QWEN05 = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
              num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
              rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645)
MODELS = {"~100M": ({**QWEN05, "num_hidden_layers": 5, "vocab_size": 32000, "eos_token_id": 2}, "bfloat16"),
          "~500M": (QWEN05, "bfloat16")}

ARMS = {  # name -> (overrides, runs under taskset -c 1 with the server on core 0)
    "vllm_inprocess_k1": (["algo=grpo_onpolicy", "rollout=vllm"], False),
    "vllm_inprocess_k10": (["algo=grpo_offpolicy", "algo.steps_per_generation=10", "rollout=vllm"], False),
    "vllm_inprocess_k10_async": (["algo=grpo_offpolicy", "algo.steps_per_generation=10", "rollout=vllm",
                                  "rollout.async_generation=true"], False),
    "server_k1": (["algo=grpo_onpolicy", "rollout=vllm_server"], True),
    "server_k10": (["algo=grpo_offpolicy", "algo.steps_per_generation=10", "rollout=vllm_server"], True),
    "server_k10_async": (["algo=grpo_offpolicy", "algo.steps_per_generation=10", "rollout=vllm_server",
                          "rollout.async_generation=true"], True),
}


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def push_part(out: Path, pushes: int, sizes: list[str]) -> dict:
    """Push seconds and bytes/s per model size (module docstring)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpolab.models import TinyCharModel
    from grpolab.rollout.engines.vllm_server.engine import VLLMServerEngine

    rows = {}
    for name in sizes:
        if name == "tiny":
            spec = TinyCharModel(warmstart=None)
            model, eos, pad = spec.load_policy(None), spec.load_tokenizer().eos_token_id, 0
        else:
            arch, dtype = MODELS[name]
            torch.manual_seed(0)
            model = Qwen2ForCausalLM(Qwen2Config(**arch)).to(getattr(torch, dtype))
            eos, pad = arch["eos_token_id"], arch["eos_token_id"]
        model.eval()
        params = sum(p.numel() for p in model.parameters())
        max_len = min(128, model.config.max_position_embeddings)
        engine = VLLMServerEngine([eos], pad, max_model_len=max_len, kv_cache_memory_bytes=256 << 20,
                                  server={"devices": [0], "workdir": str(out / f"server_{name}"),
                                          "startup_timeout_s": 1200, "push_timeout_s": 1200})
        try:
            t0 = time.perf_counter()
            engine.sync_weights(model, 0)  # starts the server on the policy: the start-up load (push 1)
            start_s = time.perf_counter() - t0
            parts = []
            for i in range(1, pushes + 1):
                engine.sync_weights(model, i)
                parts.append(dict(engine._transport.last_timing))
        finally:
            engine.close()
        secs = engine.push_seconds[1:]
        mean = sum(secs) / len(secs)
        rows[name] = {"parameters": params, "dtype": str(next(model.parameters()).dtype), "bytes": engine.push_bytes[-1],
                      "server_start_s": start_s, "push_s": secs, "push_s_mean": mean,
                      "write_s_mean": sum(p["write_s"] for p in parts) / len(parts),
                      "reload_s_mean": sum(p["reload_s"] for p in parts) / len(parts),
                      "bytes_per_s": engine.push_bytes[-1] / mean, "probe": engine.sync_check, "load": load()}
        print(name, json.dumps(rows[name]), flush=True)
        del model
    return rows


def steps_part(out: Path, steps: int, arms: list[str]) -> dict:
    """Steps/s of each arm (module docstring)."""
    folder = save_long_completion_model(out / "random_long_model", 4.0)
    rows = {}
    for arm in arms:
        over, pinned = ARMS[arm]
        run_dir = out / arm
        threads = 1 if pinned else 2
        cmd = [sys.executable, "src/train.py", *over, *COMMON, *WORK, f"trainer.max_steps={steps}",
               f"model.path={folder}", f"hydra.run.dir={run_dir}",
               "+callbacks.threads._target_=grpolab.callbacks.threads.TorchThreads",
               f"+callbacks.threads.num_threads={threads}"]
        if pinned:
            cmd = ["taskset", "-c", "1", *cmd, "rollout.server.devices=[0]"]
        print("+", " ".join(cmd), flush=True)
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True)
        k = 1 if "k1" in arm and "k10" not in arm else 10
        rows[arm] = {**measure(run_dir, k), "wall_s": time.perf_counter() - t0, "load": load()}
        print(arm, json.dumps(rows[arm]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["push", "steps", "both"], default="both")
    parser.add_argument("--pushes", type=int, default=3, help="timed pushes per model (after the start-up load)")
    parser.add_argument("--sizes", nargs="+", default=["tiny", "~100M", "~500M"])
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per arm (a multiple of 10)")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    args = parser.parse_args()
    out = ROOT / "benchmarks" / "results" / "sampler_server" / time.strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"cores": os.cpu_count(), "start": load()}
    if args.part in ("push", "both"):
        results["push"] = push_part(out, args.pushes, args.sizes)
        (out / "results.json").write_text(json.dumps(results, indent=2))
    if args.part in ("steps", "both"):
        results["steps"] = steps_part(out, args.steps, args.arms)
    results["end"] = load()
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"\nresults in {out}")
    for name, r in results.get("push", {}).items():
        print(f"push {name:6s} {r['parameters'] / 1e6:8.1f}M {r['dtype']:15s} {r['bytes'] / 2**20:9.1f} MiB "
              f"{r['push_s_mean']:7.3f} s (write {r['write_s_mean']:.3f} + reload {r['reload_s_mean']:.3f}) "
              f"{r['bytes_per_s'] / 2**30:6.2f} GiB/s  server start {r['server_start_s']:.0f} s")
    for arm, r in results.get("steps", {}).items():
        print(f"{arm:26s} {r['steps_per_s']:7.3f} steps/s  steady {r['steady_steps_per_s']:7.3f}  pushes "
              f"{r['weight_syncs']:3d} x {r['sync_ms']:8.1f} ms  lag max {r['lag_max']}")
    print(results["start"], "->", results["end"])


if __name__ == "__main__":
    main()
