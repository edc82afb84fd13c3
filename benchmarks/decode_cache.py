"""The decode loop's KV cache: transformers' DynamicCache (grows by ``torch.cat``) against the preallocated one.

    python benchmarks/decode_cache.py              # tiny at 64 and 1280 rows, random 0.5B at 16 rows x 64 tokens
    python benchmarks/decode_cache.py --quick      # fewer rows, tokens and 0.5B layers: checks the script
    python benchmarks/decode_cache.py --cases tiny_64 tiny_1280 --rounds 3

Not CI. Both caches run in ONE process, alternated (dynamic, preallocated, dynamic, preallocated, ...: ``--rounds``
pairs), first with one torch thread, then with all of them (``torch.get_num_threads()`` at start). Each run is
:func:`grpolab.rollout.engines.decode.sample_completions` (sampling at temperature 1 with a seeded generator, rows
dropped when they stop, each group's prompt prefilled once) on the same prompts; every run's tokens and log-probs
must equal the first dynamic run's (the script stops otherwise). Before them, an untimed warm-up of each cache
(4 new tokens) per case and thread count.

Cases (``--cases``):

* ``tiny_64`` / ``tiny_1280``: the embedded model of conf/model/tiny.yaml (hidden 128, 5 layers, 4 heads, 2 KV
  heads; random weights, no warm start), arithmetic prompts, 8 completions per prompt (64 rows: the default
  training batch, 8 prompts x 8; 1280 rows: 160 x 8), ``max_new_tokens`` 6 (``algo.max_completion_length``) and
  32 (``tiny_*_32``).
* ``qwen0.5b_16``: Qwen2.5-0.5B's shape (conf/model/qwen0.5b.yaml ``architecture``, random weights,
  ``--dtype``), GSM8K prompts through the real tokenizer's chat template (~100 tokens), 4 prompts x 4 = 16 rows,
  64 new tokens (``--qwen-new-tokens``; random weights over 151k ids: no row stops early).

Reported per case and thread count: completion tokens per second (tokens up to and including each row's stop,
summed over the runs of each cache, divided by their summed seconds) and the ratio preallocated / dynamic; plus
the load average (``os.getloadavg``) before and after, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import yaml

from grpolab.models import PretrainedModel, TinyCharModel
from grpolab.random_init import random_from_architecture
from grpolab.rollout.engines.base import left_pad
from grpolab.rollout.engines.decode import sample_completions

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
CASES = ("tiny_64", "tiny_1280", "tiny_64_32", "tiny_1280_32", "qwen0.5b_16")


def tiny_case(prompts: int, group: int, new_tokens: int) -> dict:
    """The conf/model/tiny.yaml model (random weights) and ``prompts`` arithmetic prompts repeated ``group``
    times."""
    from grpolab.tasks.arithmetic import ArithmeticTask

    conf = yaml.safe_load((ROOT / "conf" / "model" / "tiny.yaml").read_text())
    arch = {k: conf[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                 "intermediate_size", "max_position_embeddings")}
    spec = TinyCharModel(warmstart=None, seed=0, **arch)
    tok = spec.load_tokenizer()
    task = ArithmeticTask(val_size=16, test_size=16, seed=0)
    rows = task.splits()["train"][:prompts]
    ids = [tok(task.format_prompt(r, tok))["input_ids"] for r in rows]
    return dict(model=spec.load_policy().eval(), prompts=[p for p in ids for _ in range(group)],
                stop=spec.stop_token_ids(tok), pad=tok.pad_token_id, new_tokens=new_tokens)


def qwen_case(prompts: int, group: int, new_tokens: int, layers: int | None, dtype: torch.dtype) -> dict:
    """Qwen2.5-0.5B's architecture with random weights and GSM8K prompts in the real tokenizer's chat template."""
    from grpolab.tasks.gsm8k import GSM8KTask

    conf = yaml.safe_load((ROOT / "conf" / "model" / "qwen0.5b.yaml").read_text())
    arch = dict(conf["architecture"])
    if layers:
        arch["num_hidden_layers"] = layers
    spec = PretrainedModel(name_or_path=str(DATA / "qwen2.5-tokenizer"))
    tok = spec.load_tokenizer()
    task = GSM8KTask(path=str(DATA / "gsm8k" / "train.jsonl"), test_path=str(DATA / "gsm8k" / "test.jsonl"),
                     val_size=4, test_size=4, seed=0)
    rows = task.splits()["train"][:prompts]
    ids = [tok(task.format_prompt(r, tok), add_special_tokens=False)["input_ids"] for r in rows]
    model = random_from_architecture(arch, seed=0, dtype=dtype, attn_implementation="sdpa").eval()
    return dict(model=model, prompts=[p for p in ids for _ in range(group)], stop=[tok.eos_token_id],
                pad=tok.pad_token_id, new_tokens=new_tokens)


def run_once(case: dict, implementation: str) -> tuple[float, torch.Tensor, torch.Tensor]:
    """One ``sample_completions`` call: (seconds, tokens [B, L], log-probs [B, L])."""
    ids, mask = left_pad(case["prompts"], case["pad"])
    gen = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    tokens, logp = sample_completions(case["model"], ids, mask, case["new_tokens"], case["stop"], case["pad"],
                                      1.0, True, True, generator=gen, cache_implementation=implementation)
    return time.perf_counter() - start, tokens, logp


def completion_tokens(tokens: torch.Tensor, stop: list[int]) -> int:
    """Tokens up to and including each row's first stop (all of them when a row never stops)."""
    hit = torch.isin(tokens, torch.tensor(stop))
    after = (hit.cumsum(1) - hit.long()) > 0  # strictly after the first stop
    return int((~after).sum())


def compare(case: dict, rounds: int) -> dict:
    """Alternate the two caches ``rounds`` times after a short warm-up (4 new tokens each); every run's tokens and
    log-probs must equal the first dynamic run's exactly."""
    for impl in ("dynamic", "preallocated"):
        run_once({**case, "new_tokens": min(case["new_tokens"], 4)}, impl)
    seconds = {"dynamic": 0.0, "preallocated": 0.0}
    count = {"dynamic": 0, "preallocated": 0}
    ref = None
    for _ in range(rounds):
        for impl in ("dynamic", "preallocated"):
            s, tokens, logp = run_once(case, impl)
            ref = ref or (tokens, logp)
            if not (torch.equal(tokens, ref[0]) and torch.equal(logp, ref[1])):
                raise AssertionError(f"{impl}: other tokens or log-probs than the dynamic cache's")
            seconds[impl] += s
            count[impl] += completion_tokens(tokens, case["stop"])
    tok_s = {k: count[k] / seconds[k] for k in seconds}
    return dict(rows=len(case["prompts"]), new_tokens=case["new_tokens"], tokens=count["dynamic"] // rounds,
                dynamic_tok_s=tok_s["dynamic"], preallocated_tok_s=tok_s["preallocated"],
                ratio=tok_s["preallocated"] / tok_s["dynamic"])


def build(name: str, quick: bool, dtype: torch.dtype, qwen_tokens: int = 64) -> dict:
    if name.startswith("tiny"):
        parts = name.split("_")
        rows, new_tokens = int(parts[1]), int(parts[2]) if len(parts) > 2 else 6
        if quick:
            rows = min(rows, 128)
        return tiny_case(rows // 8, 8, new_tokens)
    return qwen_case(4, 4, 8 if quick else qwen_tokens, 2 if quick else None, dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=["tiny_64", "tiny_1280", "qwen0.5b_16"])
    parser.add_argument("--rounds", type=int, default=2, help="(dynamic, preallocated) pairs per measurement")
    parser.add_argument("--threads", nargs="+", default=["1", "all"], help="torch thread counts: ints or 'all'")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="the 0.5B's dtype")
    parser.add_argument("--qwen-new-tokens", type=int, default=64, help="max_new_tokens of qwen0.5b_16")
    parser.add_argument("--quick", action="store_true", help="128 rows at most, 0.5B with 2 layers, 8 tokens")
    args = parser.parse_args()
    all_threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, {all_threads} threads available, load {os.getloadavg()}")
    print("| case | rows | new tokens | threads | dynamic tok/s | preallocated tok/s | ratio | load (1 min) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.cases:
        case = build(name, args.quick, getattr(torch, args.dtype), args.qwen_new_tokens)
        for threads in args.threads:
            n = all_threads if threads == "all" else int(threads)
            torch.set_num_threads(n)
            before = os.getloadavg()[0]
            r = compare(case, args.rounds)
            print(f"| {name} | {r['rows']} | {r['new_tokens']} (~{r['tokens'] / r['rows']:.1f} per row) | {n} | "
                  f"{r['dynamic_tok_s']:.4g} | {r['preallocated_tok_s']:.4g} | {r['ratio']:.2f} | "
                  f"{before:.1f}-{os.getloadavg()[0]:.1f} |", flush=True)
        del case
    torch.set_num_threads(all_threads)


if __name__ == "__main__":
    main()
