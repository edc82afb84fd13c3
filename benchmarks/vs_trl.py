"""grpolab vs TRL's GRPOTrainer: seconds per optimizer step at equal work, side by side (docs/results/performance.md).

    # once: TRL in its own venv (never a dependency of grpolab)
    python -m venv .venv-trl
    .venv-trl/bin/pip install torch==2.13.0 -r benchmarks/requirements-trl.txt
    # the measurement (on an idle machine)
    python benchmarks/vs_trl.py --trl-python .venv-trl/bin/python                  # the tiny cases
    python benchmarks/vs_trl.py --trl-python .venv-trl/bin/python --cases qwen0.5b --threads 1 --repeats 2
    python benchmarks/vs_trl.py --quick ...          # a smoke run of the whole pipeline (qwen0.5b: 1 layer)

Both frameworks get the same model folder and tokenizer, the same prompt strings and reward, beta 0, lr 1e-4,
temperature 1, top_k 0, top_p 1, grad clip 1.0, fp32 on CPU, no gradient checkpointing (TRL's GRPOConfig
turns it on by default), ``--threads`` torch threads. Cases:

* tiny (``onpolicy``, ``offpolicy``, ``long``): "a+b=" prompts and exact-match reward, 16 prompts x 8
  completions per optimizer step; on-policy and off-policy (k = 10 steps per generation) with the warm-started
  tiny model and completions of up to 6 tokens, and on-policy with a random tiny model and up to 48 tokens.
* ``qwen0.5b`` (not in the default ``--cases``): the Qwen2.5-0.5B shape (``conf/model/qwen0.5b.yaml``'s
  architecture, 494M parameters) with random weights (seed 0) and the real Qwen2.5 tokenizer, GSM8K training
  prompts in its chat template as grpolab's ``data=gsm8k`` builds them (56-256 tokens, median 100), 2 prompts
  x 4 completions per step, up to 32 tokens. The reward is grpolab's gsm8k verifier and, in TRL, "the last
  number equals the gold": ~always 0 with random weights, so every group has zero reward variance, zero
  advantages and a zero gradient. Neither framework skips work for it (grpolab's ``algo.mask_zero_std_groups``
  is false by default; both run the loss, backward and AdamW step anyway).

Each (case, threads) runs grpolab and TRL alternately in fresh processes, ``--repeats`` times; a run's s/step
is the mean over the steps after the case's warm-up (steps 5+ of 25 for the tiny cases, 3+ of 7 for
qwen0.5b; refresh steps included); the table shows the best run of each.

Known differences in work: grpolab runs each prompt once per group in its log-prob pass
(``algo.shared_prompt_forward``, exact), TRL once per completion, which matters at qwen0.5b's long prompts
(``--extra algo.shared_prompt_forward=false`` to compare without it); grpolab computes its Theorem 1
diagnostic (one more no-grad forward) at steps 0, 10, 20 (``algo.lower_bound_every``). The grpolab worker
calls ``grpolab.app.run.build`` directly, so ``malloc_mmap_threshold`` (applied by ``src/train.py``) stays at
glibc's default, as in TRL. Neither writes a checkpoint (a 0.5B fp32 one with AdamW state is ~6 GB).

This file runs in both venvs: the parent and the grpolab worker import grpolab, the TRL worker imports
only torch, transformers, datasets and trl.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"  # gsm8k/{train,test}.jsonl, qwen2.5-tokenizer/


class Case(NamedTuple):
    description: str
    model: str                  # model folder: warm | random (tiny char model) | qwen0.5b
    steps_per_generation: int   # k
    max_completion_length: int  # tokens
    prompts_per_step: int = 16  # completions per optimizer step = prompts_per_step * num_generations
    num_generations: int = 8
    steps: int = 25             # optimizer steps per run (--steps overrides)
    skip: int = 4               # s/step is the mean over steps skip+1 .. steps


CASES = {
    "onpolicy": Case("on-policy, completions up to 6 tokens", "warm", 1, 6),
    "offpolicy": Case("off-policy k=10, up to 6 tokens", "warm", 10, 6),
    "long": Case("on-policy, up to 48 tokens, random tiny model", "random", 1, 48),
    "qwen0.5b": Case("Qwen2.5-0.5B shape, random weights, GSM8K prompts in the chat template, up to 32 tokens",
                     "qwen0.5b", 1, 32, prompts_per_step=2, num_generations=4, steps=7, skip=2),
}


def gsm8k_overrides(data: Path) -> list[str]:
    """grpolab's GSM8K task and verifier on the local files (val_size 2: almost every row trains)."""
    return ["data=gsm8k", "verifier=gsm8k", f"data.path={data / 'gsm8k' / 'train.jsonl'}",
            f"data.test_path={data / 'gsm8k' / 'test.jsonl'}", "data.val_size=2"]


def prompts_file(out: Path, case: Case) -> Path:
    return out / ("prompts_gsm8k.jsonl" if case.model == "qwen0.5b" else "prompts.jsonl")


# ------------------------------------------------------------------------------------------- setup (grpolab)
def prepare(out: Path, quick: bool, cases: list[str], data: Path) -> dict[str, str]:
    """Write the prompts files and the model folders the cases need (skipped when already there).

    Returns:
        Model folder per kind (``warm``, ``random``, ``qwen0.5b``).
    """
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    kinds = {CASES[c].model for c in cases}
    folders = {kind: str(out / f"model_{kind}") for kind in kinds}
    tiny = kinds & {"warm", "random"}
    if tiny:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = compose(config_name="train", overrides=["paths.output_dir=."])
        task = instantiate(cfg.data)
        with open(out / "prompts.jsonl", "w") as f:
            for row in task.splits()["train"]:
                f.write(json.dumps({"prompt": task.format_prompt(row, None), "answer": row["answer"]}) + "\n")
        for kind in tiny:
            if (Path(folders[kind]) / "config.json").exists():
                continue
            spec = instantiate(cfg.model, warmstart=None if (kind == "random" or quick) else cfg.model.warmstart)
            spec.load_policy(task).save_pretrained(folders[kind])
            spec.load_tokenizer().save_pretrained(folders[kind])
    if "qwen0.5b" in kinds:
        prepare_qwen(Path(folders["qwen0.5b"]), out / "prompts_gsm8k.jsonl", quick, data)
    return folders


def prepare_qwen(folder: Path, prompts: Path, quick: bool, data: Path) -> None:
    """The Qwen2.5-0.5B-shape folder (random weights, seed 0, fp32; 1 layer with ``quick``) with the Qwen2.5
    tokenizer, and the GSM8K training prompts in its chat template exactly as grpolab's data=gsm8k builds them."""
    import torch
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from grpolab.random_init import random_from_architecture

    if not (folder / "config.json").exists():
        arch = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model" / "qwen0.5b.yaml").architecture)
        if quick:
            arch["num_hidden_layers"] = 1
        random_from_architecture(arch, seed=0, dtype=torch.float32).save_pretrained(folder)
        AutoTokenizer.from_pretrained(data / "qwen2.5-tokenizer").save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["paths.output_dir=.", *gsm8k_overrides(data)])
    task = instantiate(cfg.data)
    with open(prompts, "w") as f:
        for row in task.splits()["train"]:
            f.write(json.dumps({"prompt": task.format_prompt(row, tokenizer), "answer": row["answer"]}) + "\n")


# --------------------------------------------------------------------------------------------- workers
def worker_grpolab(a: argparse.Namespace) -> list[float]:
    import lightning as L
    import torch
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from grpolab.app.run import build

    case = CASES[a.case]
    torch.set_num_threads(a.threads[0])
    algo = "grpo_onpolicy" if case.steps_per_generation == 1 else "grpo_offpolicy"
    overrides = [f"algo={algo}", f"algo.steps_per_generation={case.steps_per_generation}",
                 f"algo.per_device_train_batch_size={case.prompts_per_step * case.num_generations}",
                 f"algo.num_generations={case.num_generations}",
                 f"algo.max_completion_length={case.max_completion_length}",
                 "algo.beta=0.0", "algo.learning_rate=1e-4", "algo.temperature=1.0", "algo.max_grad_norm=1.0",
                 f"torch_threads={a.threads[0]}",  # torch_threads=auto would pin the tiny model to 1 thread
                 f"model.path={a.model}", f"trainer.max_steps={a.steps}", "+trainer.limit_val_batches=0",
                 "trainer.enable_progress_bar=false", "val.at_start=false", "save_policy=false",
                 "~callbacks.model_checkpoint", "~callbacks.periodic_checkpoint"]  # no end-of-run last.ckpt
    if case.model == "qwen0.5b":  # the random-weight folder replaces the hub weights and tokenizer
        overrides = ["model=qwen0.5b", f"model.tokenizer_path={a.model}", "model.dtype=float32",
                     "model.gradient_checkpointing=false", "trainer.precision=32-true",
                     *gsm8k_overrides(Path(a.data)), *overrides]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[*overrides, *a.extra], return_hydra_config=True)
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

    case = CASES[a.case]
    torch.set_num_threads(a.threads[0])
    rows = [json.loads(line) for line in open(a.prompts)]
    dataset = Dataset.from_list(rows)  # "prompt" is plain text (already templated): TRL tokenizes it as is

    def exact(completions: list[str], answer: list[str], **kwargs) -> list[float]:
        return [1.0 if c.strip() == g.strip() else 0.0 for c, g in zip(completions, answer, strict=True)]

    def last_number(completions: list[str], answer: list[str], **kwargs) -> list[float]:
        found = [re.findall(r"-?\d[\d,]*(?:\.\d+)?", c) for c in completions]
        return [1.0 if f and f[-1].replace(",", "") == g else 0.0 for f, g in zip(found, answer, strict=True)]

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_end(self, *args, **kwargs) -> None:
            times.append(time.perf_counter())

    args = GRPOConfig(
        output_dir=a.workdir, per_device_train_batch_size=case.prompts_per_step * case.num_generations,
        num_generations=case.num_generations, steps_per_generation=case.steps_per_generation,
        max_completion_length=case.max_completion_length, learning_rate=1e-4, beta=0.0, temperature=1.0,
        top_k=0, top_p=1.0, max_grad_norm=1.0, max_steps=a.steps, logging_steps=1, save_strategy="no",
        report_to="none", use_cpu=True, bf16=False, gradient_checkpointing=False, seed=0, disable_tqdm=True,
        loss_type="bnpo", scale_rewards="group")
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    reward = last_number if case.model == "qwen0.5b" else exact
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset,
                          processing_class=AutoTokenizer.from_pretrained(a.model), callbacks=[Timer()])
    times.append(time.perf_counter())
    trainer.train()
    return times


# ---------------------------------------------------------------------------------------------- parent
def run_one(framework: str, python: str, case: str, threads: int, folders: dict[str, str], out: Path,
            steps: int, data: Path, extra: list[str]) -> float:
    c = CASES[case]
    workdir = Path(tempfile.mkdtemp(prefix=f"{framework}-{case}-{threads}t-", dir=out))
    result = workdir / "times.json"
    cmd = [python, str(Path(__file__).resolve()), "--worker", framework, "--case", case, "--threads", str(threads),
           "--model", folders[c.model], "--prompts", str(prompts_file(out, c)), "--workdir", str(workdir),
           "--steps", str(steps), "--data", str(data), "--result", str(result), "--extra", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT / "src")}
    with open(workdir / "log.txt", "w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise RuntimeError(f"{framework} {case} {threads}t failed; see {workdir / 'log.txt'}")
    times = json.loads(result.read_text())
    steps_done = len(times) - 1
    if steps_done < c.skip + 1:
        raise RuntimeError(f"{framework} {case}: only {steps_done} steps timed; use --steps > {c.skip}")
    return (times[-1] - times[c.skip]) / (steps_done - c.skip)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trl-python", default=".venv-trl/bin/python", help="python of the venv with TRL")
    p.add_argument("--cases", nargs="+", default=[c for c in CASES if c != "qwen0.5b"], choices=list(CASES),
                   help="default: the tiny cases")
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=None,
                   help="optimizer steps per run (default per case: 25, qwen0.5b 7; the first 4 (2) are warm-up)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: random models (qwen0.5b: 1 layer), 1 repeat, warm-up + 2 steps, 1 thread")
    p.add_argument("--out", default=None, help="work folder (default benchmarks/results/vs_trl_<time>)")
    p.add_argument("--data", default=str(DATA), help="shared data folder (gsm8k/, qwen2.5-tokenizer/)")
    p.add_argument("--extra", nargs="*", default=[], help="extra Hydra overrides for the grpolab runs")
    # worker-only arguments
    p.add_argument("--worker", choices=["grpolab", "trl"])
    for name in ("--case", "--model", "--prompts", "--workdir", "--result"):
        p.add_argument(name)
    a = p.parse_args()
    if a.worker:
        times = (worker_grpolab if a.worker == "grpolab" else worker_trl)(a)
        Path(a.result).write_text(json.dumps(times))
        return
    if a.quick:
        a.repeats, a.threads = 1, [1]
    out = Path(a.out or ROOT / "benchmarks" / "results" / time.strftime("vs_trl_%Y-%m-%d_%H-%M-%S"))
    out.mkdir(parents=True, exist_ok=True)
    data = Path(a.data).resolve()
    folders = prepare(out, a.quick, a.cases, data)
    pythons = {"grpolab": sys.executable, "trl": a.trl_python}
    rows = []
    for case in a.cases:
        c = CASES[case]
        steps = c.skip + 2 if a.quick else a.steps or c.steps
        for threads in a.threads:
            best = {"trl": float("inf"), "grpolab": float("inf")}
            for r in range(a.repeats):
                for fw in ("trl", "grpolab") if r % 2 == 0 else ("grpolab", "trl"):  # alternate the order
                    s = run_one(fw, pythons[fw], case, threads, folders, out, steps, data, a.extra)
                    best[fw] = min(best[fw], s)
                    print(f"  {case:9s} {threads}t repeat {r + 1}: {fw:7s} {s:.3f} s/step", flush=True)
            rows.append((case, threads, best["trl"], best["grpolab"]))
    lines = ["| case | threads | TRL s/step | grpolab s/step | grpolab/TRL |", "|---|---|---|---|---|"]
    lines += [f"| {CASES[c].description} | {t} | {trl:.3f} | {g:.3f} | {g / trl:.2f} |" for c, t, trl, g in rows]
    table = "\n".join(lines)
    print("\n" + table)
    (out / "table.md").write_text(table + "\n")
    print(f"\nwritten to {out / 'table.md'}")


if __name__ == "__main__":
    main()
