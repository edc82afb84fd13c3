"""Peak memory and seconds of one GRPO step: full fine-tuning vs LoRA, beta 0 vs 0.04, checkpointing off/on.

    python benchmarks/memory.py                    # ~100M-param random Qwen2, Qwen2.5 tokenizer, GSM8K prompts
    python benchmarks/memory.py --quick            # tiny sizes, checks the script end to end in ~1-2 minutes
    python benchmarks/memory.py --accelerator gpu --precision bf16-mixed     # on a GPU: CUDA peak allocated

Each case runs in a FRESH subprocess (so the peak is that case's own): it builds the real training stack
(grpolab.app.run.build: model, reference model when beta > 0, LoRA through PEFT, rollout, optimizer) and fits
``--steps`` GRPO steps (rollout + loss + backward + AdamW step). Reported per case:

* ``peak_MiB``: CPU: the process's peak resident set size (``getrusage(RUSAGE_SELF).ru_maxrss``, the
  kernel's high-water mark, which counts torch's allocations; tracemalloc would not); GPU:
  ``torch.cuda.max_memory_allocated``.
* ``imports_MiB``: the resident set after the imports, before any model is built (CPU; subtract it from
  the CPU peak for the model and step alone).
* ``train_s`` / ``rollout_s``: seconds of the LAST step's training part (forward + backward + optimizer) and
  of its rollout (generation, scoring, reference/sampler log-probs), after ``--steps - 1`` warm-up steps.
* ``params`` / ``trainable``: parameter counts.

The model is a Qwen2 built locally from a config (hidden 512, 8 layers, tied 151k-token embeddings: ~103M
parameters) with random weights and the real Qwen2.5 tokenizer from ../shared/data, so nothing is
downloaded. Results go to stdout and benchmarks/results/memory_<timestamp>.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"

FULL = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
            intermediate_size=1408, per_device_train_batch_size=16, num_generations=8, max_completion_length=128)
QUICK = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, per_device_train_batch_size=4, num_generations=2, max_completion_length=8)


def overrides(size: dict, lora_r: int | None, beta: float, checkpointing: bool, accelerator: str, precision: str,
              steps: int, out: Path) -> list[str]:
    """Hydra overrides of conf/train.yaml for one case."""
    return [
        "model=tiny_qwen", f"model.tokenizer_path={DATA / 'qwen2.5-tokenizer'}",
        *(f"model.{k}={size[k]}" for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                           "num_key_value_heads", "intermediate_size")),
        f"model.gradient_checkpointing={str(checkpointing).lower()}", f"model.lora.r={'null' if lora_r is None else lora_r}",
        "data=gsm8k", f"data.path={DATA / 'gsm8k' / 'train.jsonl'}", f"data.test_path={DATA / 'gsm8k' / 'test.jsonl'}",
        "data.val_size=4", "verifier=gsm8k", f"algo.beta={beta}", "algo.truncated_reward=-1.0",
        f"algo.per_device_train_batch_size={size['per_device_train_batch_size']}",
        f"algo.num_generations={size['num_generations']}", f"algo.max_completion_length={size['max_completion_length']}",
        "trainer=cpu", f"trainer.accelerator={accelerator}", f"trainer.precision={precision}", f"trainer.max_steps={steps}",
        "trainer.val_check_interval=100000", "trainer.enable_progress_bar=false", "val.at_start=false",
        "save_policy=false", "~callbacks.model_checkpoint", "~callbacks.completions",
        f"paths.output_dir={out}",
    ]


def run_case(args: argparse.Namespace) -> dict:
    """Child: build and fit one case, return its measurements."""
    import pandas as pd
    import psutil
    import torch
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from grpolab.app.run import build
    from grpolab.lora import count_parameters

    case = json.loads(args.case)
    out = Path(case["out"])
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=case["overrides"], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    base = psutil.Process().memory_info().rss / 2**20  # after imports, before any model is built
    parts = build(cfg)
    module, dm, trainer = parts["module"], parts["datamodule"], parts["trainer"]
    trainer.fit(module, datamodule=dm)
    metrics = pd.read_csv(out / "metrics.csv").dropna(subset=["train/step_time"])
    last = metrics.iloc[-1]
    if torch.cuda.is_available() and case["accelerator"] == "gpu":
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    rollout = metrics["train/time/rollout"].diff().iloc[-1] if len(metrics) > 1 else metrics["train/time/rollout"].iloc[-1]
    return {"peak_MiB": round(peak, 1), "imports_MiB": round(base, 1), "train_s": round(float(last["train/step_time"]), 3),
            "rollout_s": round(float(rollout), 3), **count_parameters(module.policy)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: check the script end to end")
    parser.add_argument("--accelerator", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--precision", default="32-true", help="trainer.precision, e.g. bf16-mixed")
    parser.add_argument("--steps", type=int, default=2, help="GRPO steps per case (the last one is timed)")
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case in this process
    args = parser.parse_args()
    if args.case:
        print("RESULT " + json.dumps(run_case(args)), flush=True)
        return
    size = QUICK if args.quick else FULL
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    base = ROOT / "benchmarks" / "results" / f"memory_{stamp}"
    rows = []
    for lora_r, beta, ckpt in itertools.product([None, args.lora_r], [0.0, 0.04], [False, True]):
        name = f"{'lora' if lora_r else 'full'}_beta{beta}_ckpt{int(ckpt)}"
        out = base / name
        case = {"out": str(out), "accelerator": args.accelerator,
                "overrides": overrides(size, lora_r, beta, ckpt, args.accelerator, args.precision, args.steps, out)}
        env_cmd = [sys.executable, __file__, "--case", json.dumps(case)]
        res = subprocess.run(env_cmd, cwd=ROOT, capture_output=True, text=True)
        lines = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
        if res.returncode != 0 or not lines:
            sys.exit(f"case {name} failed:\n{res.stderr[-3000:]}")
        row = {"case": name, "lora_r": lora_r, "beta": beta, "gradient_checkpointing": ckpt,
               **json.loads(lines[-1][len("RESULT "):])}
        rows.append(row)
        print(json.dumps(row), flush=True)
    base.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{base}.json").write_text(json.dumps({"args": vars(args), "size": size, "rows": rows}, indent=2))
    print("\n| fine-tuning | beta | checkpointing | params | trainable | peak MiB | peak - imports MiB | train s | rollout s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {'LoRA r=' + str(r['lora_r']) if r['lora_r'] else 'full'} | {r['beta']} | "
              f"{'on' if r['gradient_checkpointing'] else 'off'} | {r['num_params'] / 1e6:.1f}M | "
              f"{r['num_trainable_params'] / 1e6:.2f}M | {r['peak_MiB']:.0f} | {r['peak_MiB'] - r['imports_MiB']:.0f} | {r['train_s']:.2f} | {r['rollout_s']:.2f} |")
    for ckpt in (False, True):  # the goal: the LoRA reference (adapters disabled) costs < 10% peak memory
        by = {r["beta"]: r["peak_MiB"] for r in rows if r["lora_r"] and r["gradient_checkpointing"] == ckpt}
        print(f"LoRA, checkpointing {'on' if ckpt else 'off'}: peak beta=0.04 / beta=0 = {by[0.04] / by[0.0]:.3f}")


if __name__ == "__main__":
    main()
