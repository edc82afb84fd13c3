"""Can generation and training overlap on a small CPU? A thread versus a subprocess, on the tiny architecture.

    python benchmarks/async_overlap.py                # 1280 completions of 48 tokens vs 10 training steps
    python benchmarks/async_overlap.py --quick        # small sizes: checks that it runs

One round of asynchronous off-policy GRPO is: generate the next buffer (k x 128 completions) while the trainer
takes k optimizer steps. This times that round four ways, with one torch intra-op thread per Python thread or
process (torch 2.13's ``set_num_threads`` is process-wide, so it cannot give two threads of one process
different counts):

* ``sequential``: generate, then train (what synchronous off-policy GRPO does);
* ``thread``: generate in a background thread of the same process (what ``rollout.async_generation`` does);
* ``process``: generate in a persistent subprocess (``torch.multiprocessing`` spawn) whose sampler weights live
  in shared memory, so a push is a ``load_state_dict`` in the parent; its start-up is not counted;
* ``generate only`` and ``train only``: the two parts alone (the best overlap is their max).

Both overlap variants compete for the cores with each other only; a thread also shares the GIL with the
trainer for Python-level work (per-token and per-layer overhead, large for a model this small). Timings are
only meaningful on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import copy
import threading
import time

import torch
import torch.multiprocessing as mp
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM


def build(args) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=32, hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=3 * args.hidden, max_position_embeddings=128,
                      tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg)


def generate(model, n: int, tokens: int, generator: torch.Generator | None = None) -> torch.Tensor:
    prompts = torch.randint(3, 32, (n, 8), generator=generator)
    config = GenerationConfig(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=True, top_k=0, top_p=1.0,
                              pad_token_id=0, eos_token_id=1)
    with torch.no_grad():
        return model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), generation_config=config)


def train(policy, opt, steps: int, rows: int, tokens: int) -> None:
    for _ in range(steps):
        x = torch.randint(3, 32, (rows, 8 + tokens))
        logp = torch.log_softmax(policy(input_ids=x).logits.float(), -1)
        loss = -logp.gather(-1, x[:, :, None]).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def _worker(model, conn, n: int, tokens: int) -> None:
    torch.set_num_threads(1)
    model.eval()
    while conn.recv() == "generate":
        generate(model, n, tokens)
        conn.send("done")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--k", type=int, default=10, help="optimizer steps per buffer")
    parser.add_argument("--rows", type=int, default=128, help="completions per optimizer step")
    parser.add_argument("--tokens", type=int, default=48, help="completion length (every completion runs to it)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.hidden, args.layers, args.k, args.rows, args.tokens, args.repeats = 32, 2, 2, 16, 8, 1
    torch.set_num_threads(1)
    policy = build(args)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    sampler = copy.deepcopy(policy).eval().requires_grad_(False)
    n = args.k * args.rows
    gen = lambda: generate(sampler, n, args.tokens)  # noqa: E731
    trn = lambda: train(policy, opt, args.k, args.rows, args.tokens)  # noqa: E731
    gen(), trn()  # warm-up

    shared = copy.deepcopy(sampler).share_memory()
    parent, child = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(target=_worker, args=(shared, child, n, args.tokens), daemon=True)
    proc.start()
    parent.send("generate"), parent.recv()  # start-up and warm-up, not timed

    def thread_round() -> None:
        t = threading.Thread(target=gen)
        t.start()
        trn()
        t.join()

    def process_round() -> None:
        shared.load_state_dict(policy.state_dict())  # the push
        parent.send("generate")
        trn()
        parent.recv()

    variants = {"generate only": gen, "train only": trn, "sequential": lambda: (gen(), trn()),
                "thread": thread_round, "process": process_round}
    times = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    parent.send("stop")
    proc.join(timeout=10)
    seq = min(times["sequential"])
    print(f"one round: generate {n} completions x {args.tokens} tokens, train {args.k} steps of {args.rows} rows "
          f"(hidden {args.hidden}, {args.layers} layers; best of {args.repeats})")
    for name, ts in times.items():
        print(f"{name:14s} {min(ts):7.2f} s   {seq / min(ts):5.2f}x sequential")


if __name__ == "__main__":
    main()
