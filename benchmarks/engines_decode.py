"""Our Hugging Face decode loop against the in-process vLLM engine at Qwen2.5-0.5B, same prompts, one process.

    ~/.cache/grpolab/venv-vllm/bin/python benchmarks/engines_decode.py                 # rows 4 16 64, 2 rounds
    ~/.cache/grpolab/venv-vllm/bin/python benchmarks/engines_decode.py --quick         # 1 layer: checks the script

Not CI (minutes). Runs in the vLLM venv (README, "Test"), which has grpolab, torch and vLLM. The model is
Qwen2.5-0.5B's ``config.json`` shape (``conf/model/qwen0.5b.yaml``) with random weights (``model.init=random``),
the real Qwen2.5 tokenizer, and GSM8K test questions in the chat template (``data=gsm8k``'s prompt); nothing is
downloaded. vLLM gets the policy's weights by the engine's own ``sync_weights`` (the trainer's push), then, for
each batch size (``--rows``: completions decoded at once, ``--rows / 4`` prompts x 4), both engines generate
``--max-new-tokens`` tokens per row at temperature 1 (no stop token is forced: random weights rarely emit one),
alternating which goes first each round. Reported per engine: completion tokens per second (generated tokens /
wall seconds of ``generate``, sampler log-probs included as the trainer asks for them) and vLLM's ratio to ours.
Timings depend on the machine's load (recorded with ``os.getloadavg``). Results: stdout and
``benchmarks/results/engines_decode_<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


def build(dtype: str, layers: int | None):
    """The random-weight 0.5B policy, its tokenizer, and GSM8K test prompts (token ids) in the chat template."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from grpolab.random_init import random_from_architecture
    from grpolab.tasks.gsm8k import GSM8KTask

    arch = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/model/qwen0.5b.yaml").architecture)
    if layers:
        arch["num_hidden_layers"] = layers
    policy = random_from_architecture(arch, seed=0, dtype=getattr(torch, dtype)).eval()
    tok = AutoTokenizer.from_pretrained(DATA / "qwen2.5-tokenizer")
    task = GSM8KTask(path=str(DATA / "gsm8k/train.jsonl"), test_path=str(DATA / "gsm8k/test.jsonl"), val_size=2,
                     test_size=64)
    rows = task.splits()["test"]
    prompts = [tok(task.format_prompt(r, tok), add_special_tokens=False)["input_ids"] for r in rows]
    return policy, tok, prompts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", nargs="+", type=int, default=[4, 16, 64], help="completions decoded at once")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--quick", action="store_true", help="one decoder layer, rows 4, 8 tokens, 1 round")
    args = p.parse_args()
    if args.quick:
        args.rows, args.max_new_tokens, args.rounds = [4], 8, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    from grpolab.rollout.engines.base import SamplingParams
    from grpolab.rollout.engines.hf import HFGenerationEngine
    from grpolab.rollout.engines.vllm import VLLMGenerationEngine

    policy, tok, prompts = build(args.dtype, 1 if args.quick else None)
    # no stop token ever sampled in practice (random weights): every row decodes max_new_tokens
    stop = [tok.eos_token_id]
    hf = HFGenerationEngine(stop_token_ids=stop, pad_token_id=tok.pad_token_id)
    t0 = time.perf_counter()
    vllm = VLLMGenerationEngine(stop_token_ids=stop, pad_token_id=tok.pad_token_id, dtype=args.dtype,
                                kv_cache_memory_bytes=2 << 30)
    start_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    vllm.sync_weights(policy, 0)
    sync_s = time.perf_counter() - t0
    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, return_log_probs=True)
    engines = {"hf": hf, "vllm": vllm}
    results = []
    for rows in args.rows:
        batch = [prompts[i // 4 % len(prompts)] for i in range(rows)]
        with torch.no_grad():  # warm-up of both at this shape (vLLM compiles/captures per batch size)
            for e in engines.values():
                e.generate(policy, batch[: min(rows, 4)], SamplingParams(max_new_tokens=2))
        for rnd in range(args.rounds):
            order = ["hf", "vllm"] if rnd % 2 == 0 else ["vllm", "hf"]
            for name in order:
                load = os.getloadavg()[0]
                t0 = time.perf_counter()
                with torch.no_grad():
                    gen = engines[name].generate(policy, batch, params)
                dt = time.perf_counter() - t0
                tokens = int(gen.completion_mask.sum())
                results.append({"rows": rows, "round": rnd, "engine": name, "tokens": tokens, "seconds": dt,
                                "tok_s": tokens / dt, "load": load})
                print(json.dumps(results[-1]), flush=True)
    vllm.close()
    print(f"\nQwen2.5-0.5B shape, random weights, {args.dtype}, {args.max_new_tokens} new tokens per row, "
          f"torch threads {torch.get_num_threads()}; vLLM start {start_s:.1f} s, first weight push {sync_s:.1f} s")
    print("| rows | ours tok/s (best) | vLLM tok/s (best) | vLLM / ours | load (1 min) |")
    print("|---|---|---|---|---|")
    summary = []
    for rows in args.rows:
        best = {n: max(r["tok_s"] for r in results if r["rows"] == rows and r["engine"] == n) for n in engines}
        loads = [r["load"] for r in results if r["rows"] == rows]
        summary.append({"rows": rows, **{f"{n}_tok_s": round(v, 2) for n, v in best.items()},
                        "ratio": round(best["vllm"] / best["hf"], 3)})
        print(f"| {rows} | {best['hf']:.1f} | {best['vllm']:.1f} | {best['vllm'] / best['hf']:.2f} | "
              f"{min(loads):.1f}-{max(loads):.1f} |")
    out = ROOT / "benchmarks/results" / f"engines_decode_{time.strftime('%Y-%m-%d_%H-%M-%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "vllm_start_s": start_s, "vllm_first_sync_s": sync_s,
                               "runs": results, "summary": summary}, indent=1))
    print(f"written {out}")


if __name__ == "__main__":
    main()
