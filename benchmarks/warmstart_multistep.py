"""How long the tiny model's supervised warm start takes on a task, and the sampled accuracy it reaches.

    python benchmarks/warmstart_multistep.py                      # data=multistep, the configured target (0.25)
    python benchmarks/warmstart_multistep.py --data arithmetic    # the addition task, for comparison
    python benchmarks/warmstart_multistep.py --quick              # tiny settings: checks that it runs end to end

Composes conf/train.yaml exactly as ``src/train.py data=<name>`` (so the warm-start settings are the real ones),
runs :func:`grpolab.warmstart.warm_start` on one torch thread without touching the cache, then samples
``--samples`` completions for each validation prompt and prints seconds, steps, the exact expected accuracy the
warm start stopped at, and the sampled val accuracy (the value a run logs as val_accuracy_start).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def main(argv: list[str] | None = None) -> int:
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from grpolab.config import GRPOConfig
    from grpolab.rollout.producer import RolloutProducer
    from grpolab.rollout.settings import resolve_rollout
    from grpolab.warmstart import warm_start

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="multistep")
    p.add_argument("--samples", type=int, default=8, help="samples per val prompt for the sampled accuracy")
    p.add_argument("--quick", action="store_true", help="tiny target and model: an end-to-end check only")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. model.warmstart.target_accuracy=0.3")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")  # warm-start progress every 100 steps
    torch.set_num_threads(1)
    overrides = [f"data={a.data}", *a.overrides]
    if a.quick:
        overrides += ["model.warmstart.target_accuracy=1e-30", "model.hidden_size=32", "model.num_hidden_layers=1",
                      "model.num_attention_heads=2", "model.num_key_value_heads=1", "model.intermediate_size=64",
                      "model.warmstart.num_heldout=32", "model.warmstart.max_steps=50", "data.val_size=8"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    task, spec = instantiate(cfg.data), instantiate(cfg.model)
    algo = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))
    tok = spec.load_tokenizer()
    model = spec._fresh(tok)
    ws = OmegaConf.to_container(cfg.model.warmstart, resolve=True)
    report = warm_start(model, tok, task.splits()["train"], seed=int(cfg.model.seed), **ws)
    _, engine_args, _ = resolve_rollout(OmegaConf.to_container(cfg.rollout, resolve=True), algo)  # engine arguments
    engine = instantiate(engine_args, stop_token_ids=spec.stop_token_ids(tok), pad_token_id=tok.pad_token_id)
    producer = RolloutProducer(algo, task, tok, engine, instantiate(cfg.verifier))
    torch.manual_seed(0)
    t0 = time.perf_counter()
    s = producer.sample(model, task.splits()["val"], a.samples)
    report.update(data=a.data, val_sampled_accuracy=round(float(s["rewards"].nanmean()), 4),
                  val_prompts=len(task.splits()["val"]), samples=a.samples,
                  mean_completion_tokens=round(float(s["generation"].completion_mask.sum(1).float().mean()), 2),
                  sample_s=round(time.perf_counter() - t0, 2))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
