"""grpolab vs TRL's GRPOTrainer: seconds per optimizer step at equal work, side by side (docs/performance.md).

    # once: TRL in its own venv (never a dependency of grpolab)
    python -m venv .venv-trl
    .venv-trl/bin/pip install torch==2.13.0 -r benchmarks/requirements-trl.txt
    # the measurement (on an idle machine)
    python benchmarks/vs_trl.py --trl-python .venv-trl/bin/python
    python benchmarks/vs_trl.py --quick ...          # a 1-minute smoke run of the whole pipeline

Both frameworks get the same model folder and tokenizer, the same "a+b=" prompts and exact-match reward,
16 prompts x 8 completions per optimizer step, beta 0, lr 1e-4, temperature 1, top_k 0, top_p 1, grad clip
1.0, fp32 on CPU, no gradient checkpointing (TRL's GRPOConfig turns it on by default), ``--threads`` torch
threads in both. Cases: on-policy and off-policy (k = 10 steps per generation) with the warm-started tiny
model and completions of up to 6 tokens, and on-policy with a random tiny model and up to 48 tokens.
Each (case, threads) runs grpolab and TRL alternately in fresh processes, ``--repeats`` times; a run's
s/step is the mean over steps 5+ (refresh steps included); the table shows the best run of each.

This file runs in both venvs: the parent and the grpolab worker import grpolab, the TRL worker imports
only torch, transformers, datasets and trl.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS_PER_STEP, NUM_GENERATIONS, SKIP = 16, 8, 4  # s/step is the mean over steps SKIP+1 .. max_steps
CASES = {  # name: (description, model folder, steps per generation, max completion tokens)
    "onpolicy": ("on-policy, completions up to 6 tokens", "warm", 1, 6),
    "offpolicy": ("off-policy k=10, up to 6 tokens", "warm", 10, 6),
    "long": ("on-policy, up to 48 tokens, random tiny model", "random", 1, 48),
}


# ------------------------------------------------------------------------------------------- setup (grpolab)
def prepare(out: Path, quick: bool) -> dict[str, str]:
    """Write the prompts and the two model folders (warm-started and random tiny char model)."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["paths.output_dir=."])
    task = instantiate(cfg.data)
    with open(out / "prompts.jsonl", "w") as f:
        for row in task.splits()["train"]:
            f.write(json.dumps({"prompt": task.format_prompt(row, None), "answer": row["answer"]}) + "\n")
    folders = {}
    for kind in ("warm", "random"):
        folder = out / f"model_{kind}"
        folders[kind] = str(folder)
        if (folder / "config.json").exists():
            continue
        spec = instantiate(cfg.model, warmstart=None if (kind == "random" or quick) else cfg.model.warmstart)
        model = spec.load_policy(task)
        model.save_pretrained(folder)
        spec.load_tokenizer().save_pretrained(folder)
    return folders


# --------------------------------------------------------------------------------------------- workers
def worker_grpolab(a: argparse.Namespace) -> list[float]:
    import lightning as L
    import torch
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from grpolab.run import build

    torch.set_num_threads(a.threads[0])
    algo = "grpo_onpolicy" if a.steps_per_generation == 1 else "grpo_offpolicy"
    overrides = [f"algo={algo}", f"algo.steps_per_generation={a.steps_per_generation}",
                 f"algo.per_device_train_batch_size={PROMPTS_PER_STEP * NUM_GENERATIONS}",
                 f"algo.num_generations={NUM_GENERATIONS}", f"algo.max_completion_length={a.max_completion_length}",
                 "algo.beta=0.0", "algo.learning_rate=1e-4", "algo.temperature=1.0", "algo.max_grad_norm=1.0",
                 f"torch_threads={a.threads[0]}",  # torch_threads=auto would pin the tiny model to 1 thread
                 f"model.path={a.model}", f"trainer.max_steps={a.steps}", "+trainer.limit_val_batches=0",
                 "trainer.enable_progress_bar=false", "val.at_start=false", "save_policy=false",
                 "~callbacks.model_checkpoint", *a.extra]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = a.workdir
    times: list[float] = []

    class Timer(L.Callback):
        def on_train_batch_end(self, *args, **kwargs) -> None:
            times.append(time.perf_counter())

    parts = build(cfg)
    parts["trainer"].callbacks.append(Timer())
    times.append(time.perf_counter())
    parts["trainer"].fit(parts["module"], datamodule=parts["datamodule"])
    return times


def worker_trl(a: argparse.Namespace) -> list[float]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(a.threads[0])
    rows = [json.loads(line) for line in open(a.prompts)]
    dataset = Dataset.from_list(rows)

    def exact(completions: list[str], answer: list[str], **kwargs) -> list[float]:
        return [1.0 if c.strip() == g.strip() else 0.0 for c, g in zip(completions, answer, strict=True)]

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_end(self, *args, **kwargs) -> None:
            times.append(time.perf_counter())

    args = GRPOConfig(
        output_dir=a.workdir, per_device_train_batch_size=PROMPTS_PER_STEP * NUM_GENERATIONS,
        num_generations=NUM_GENERATIONS, steps_per_generation=a.steps_per_generation,
        max_completion_length=a.max_completion_length, learning_rate=1e-4, beta=0.0, temperature=1.0, top_k=0,
        top_p=1.0, max_grad_norm=1.0, max_steps=a.steps, logging_steps=1, save_strategy="no", report_to="none",
        use_cpu=True, bf16=False, gradient_checkpointing=False, seed=0, disable_tqdm=True, loss_type="bnpo",
        scale_rewards="group")
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=exact, args=args, train_dataset=dataset,
                          processing_class=AutoTokenizer.from_pretrained(a.model), callbacks=[Timer()])
    times.append(time.perf_counter())
    trainer.train()
    return times


# ---------------------------------------------------------------------------------------------- parent
def run_one(framework: str, python: str, case: str, threads: int, folders: dict[str, str], out: Path,
            steps: int, extra: list[str]) -> float:
    _, kind, k, length = CASES[case]
    workdir = Path(tempfile.mkdtemp(prefix=f"{framework}-{case}-{threads}t-", dir=out))
    result = workdir / "times.json"
    cmd = [python, str(Path(__file__).resolve()), "--worker", framework, "--threads", str(threads),
           "--model", folders[kind], "--prompts", str(out / "prompts.jsonl"), "--workdir", str(workdir),
           "--steps", str(steps), "--steps-per-generation", str(k), "--max-completion-length", str(length),
           "--result", str(result), "--extra", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT / "src")}
    with open(workdir / "log.txt", "w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise RuntimeError(f"{framework} {case} {threads}t failed; see {workdir / 'log.txt'}")
    times = json.loads(result.read_text())
    steps_done = len(times) - 1
    if steps_done < SKIP + 1:
        raise RuntimeError(f"{framework} {case}: only {steps_done} steps timed; use --steps > {SKIP}")
    return (times[-1] - times[SKIP]) / (steps_done - SKIP)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trl-python", default=".venv-trl/bin/python", help="python of the venv with TRL")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=25, help="optimizer steps per run (s/step over steps 5+)")
    p.add_argument("--quick", action="store_true", help="smoke run: random models, 1 repeat, 6 steps, 1 thread")
    p.add_argument("--out", default=None, help="work folder (default benchmarks/results/vs_trl_<time>)")
    p.add_argument("--extra", nargs="*", default=[], help="extra Hydra overrides for the grpolab runs")
    # worker-only arguments
    p.add_argument("--worker", choices=["grpolab", "trl"])
    for name in ("--model", "--prompts", "--workdir", "--result"):
        p.add_argument(name)
    p.add_argument("--steps-per-generation", type=int, default=1)
    p.add_argument("--max-completion-length", type=int, default=6)
    a = p.parse_args()
    if a.worker:
        times = (worker_grpolab if a.worker == "grpolab" else worker_trl)(a)
        Path(a.result).write_text(json.dumps(times))
        return
    if a.quick:
        a.repeats, a.steps, a.threads = 1, SKIP + 2, [1]
    out = Path(a.out or ROOT / "benchmarks" / "results" / time.strftime("vs_trl_%Y-%m-%d_%H-%M-%S"))
    out.mkdir(parents=True, exist_ok=True)
    folders = prepare(out, a.quick)
    pythons = {"grpolab": sys.executable, "trl": a.trl_python}
    rows = []
    for case in a.cases:
        for threads in a.threads:
            best = {"trl": float("inf"), "grpolab": float("inf")}
            for r in range(a.repeats):
                for fw in ("trl", "grpolab") if r % 2 == 0 else ("grpolab", "trl"):  # alternate the order
                    s = run_one(fw, pythons[fw], case, threads, folders, out, a.steps, a.extra)
                    best[fw] = min(best[fw], s)
                    print(f"  {case:9s} {threads}t repeat {r + 1}: {fw:7s} {s:.3f} s/step", flush=True)
            rows.append((case, threads, best["trl"], best["grpolab"]))
    lines = ["| case | threads | TRL s/step | grpolab s/step | grpolab/TRL |", "|---|---|---|---|---|"]
    lines += [f"| {CASES[c][0]} | {t} | {trl:.3f} | {g:.3f} | {g / trl:.2f} |" for c, t, trl, g in rows]
    table = "\n".join(lines)
    print("\n" + table)
    (out / "table.md").write_text(table + "\n")
    print(f"\nwritten to {out / 'table.md'}")


if __name__ == "__main__":
    main()
