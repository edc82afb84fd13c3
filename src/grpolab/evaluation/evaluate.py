"""The evaluation run behind ``src/eval.py``: sample ``n`` completions per test prompt, score them, report.

The policy comes from ``model.path`` (a run's ``policy/`` folder, any Hugging Face folder or a hub id),
from ``ckpt_path`` (a Lightning checkpoint of :class:`~grpolab.module.GRPOModule`), or from the model
config itself. Sampling goes through the same :class:`~grpolab.rollout.producer.RolloutProducer` as
training and validation, so an evaluation with ``eval.split=val`` reproduces ``val/accuracy``.

Outputs in ``eval.output_dir``: ``eval.json`` (the metrics of :func:`summarize`) and ``completions.jsonl``
(one line per completion: uid, sample index, greedy flag, prompt, gold, completion, extracted answer,
reward, verdict, truncated flag, length in tokens).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from grpolab.checkpoint import frozen_weights
from grpolab.config_checks import check_paths, check_required, check_types, type_error
from grpolab.errors import ConfigError
from grpolab.evaluation.metrics import maj_at_k, mean_at_n, pass_at_k, standard_error
from grpolab.evaluation.run_info import check_run_data, run_folder
from grpolab.rollout.settings import resolve_rollout
from grpolab.run_files import write_json
from grpolab.verifiers.extract import boxed_contents, final_answer_region

log = logging.getLogger("grpolab.eval")


@dataclass
class SamplingConfig:
    """The sampling fields :class:`~grpolab.rollout.producer.RolloutProducer` reads (duck-typed in place of
    the training ``GRPOConfig``, whose checks forbid top-p/top-k truncation that evaluation may use)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_completion_length: int = 16
    max_prompt_length: int | None = None
    truncated_reward: float | None = 0.0


def default_ks(n: int) -> list[int]:
    """``1, 2, 4, ...`` below ``n``, then ``n``.

    Examples:
        >>> default_ks(16), default_ks(10), default_ks(1)
        ([1, 2, 4, 8, 16], [1, 2, 4, 8, 10], [1])
    """
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def answer_extractor(verifier: Any):
    """A function ``completion text -> hashable answer | None`` used to group votes for maj@k.

    The first reward function with an ``extract`` method decides (GSM8K: the exact decimal). For a math
    verifier the last ``\\boxed{}`` of the final-answer region, whitespace removed. Otherwise (exact match)
    the stripped final-answer region. ``None`` = no answer (abstains from the vote).
    """
    funcs = dict(getattr(verifier, "reward_funcs", {}) or {})
    for func in funcs.values():
        if callable(getattr(func, "extract", None)):
            def from_extract(text: str, _f=func) -> str | None:
                value = _f.extract(text)
                return None if value is None else str(value)

            return from_extract
    if any(getattr(f, "name", None) == "math" for f in funcs.values()):
        def from_box(text: str) -> str | None:
            boxes = boxed_contents(final_answer_region(text))
            return "".join(boxes[-1].split()) if boxes and boxes[-1].strip() else None

        return from_box

    def stripped(text: str) -> str | None:
        region = final_answer_region(text).strip()
        return region or None

    return stripped


def load_policy(cfg: DictConfig, spec: Any, task: Any) -> torch.nn.Module:
    """The policy to evaluate: the model config's weights, replaced by ``ckpt_path``'s when given.

    Raises:
        FileNotFoundError: if ``ckpt_path`` does not exist.
        grpolab.errors.ConfigError: if ``ckpt_path`` holds anything but weights and plain values (it could run code).
        grpolab.checkpoint.frozen_weights.FrozenWeightsMismatch: the config builds another LoRA base than the checkpoint's.
        KeyError: if the checkpoint has no ``state_dict`` or no ``policy.`` weights.
        RuntimeError: if the checkpoint's weights do not fit the model config (the message lists keys).
    """
    policy = spec.load_policy(task)
    if cfg.get("ckpt_path"):
        from grpolab.checkpoint.reading import check_checkpoint, load_checkpoint

        path = check_checkpoint(cfg.ckpt_path)  # missing, empty or truncated: an error naming the path
        ckpt = load_checkpoint(path, mmap=False)  # weights and plain values only: a file that runs code is refused
        if "state_dict" not in ckpt:
            raise KeyError(f"{path}: not a Lightning checkpoint (no 'state_dict'; keys: {sorted(ckpt)[:8]})")
        frozen_weights.restore_policy(ckpt, policy, str(path))  # a LoRA base the checkpoint left out
        state = {k[len("policy."):]: v for k, v in ckpt["state_dict"].items() if k.startswith("policy.")}
        if not state:
            raise KeyError(f"{path}: no 'policy.' weights in its state_dict")
        policy.load_state_dict(state, strict=True)
        log.info("loaded policy weights from %s (global step %s)", path, ckpt.get("global_step"))
    return policy


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def build_sampling(cfg: DictConfig) -> SamplingConfig:
    """Sampling settings from ``cfg.eval``."""
    e = cfg.eval
    return SamplingConfig(temperature=float(e.temperature), top_p=float(e.top_p), top_k=int(e.top_k or 0),
                            max_completion_length=int(e.max_new_tokens),
                            max_prompt_length=None if e.max_prompt_length is None else int(e.max_prompt_length),
                            truncated_reward=None if e.truncated_reward is None else float(e.truncated_reward))


EVAL_TYPES = {"num_samples": (int,), "batch_size": (int,), "max_prompts": (int, type(None)), "greedy": (bool,),
              "correct_threshold": (float,), "seed": (int,), "temperature": (float,), "max_new_tokens": (int,)}


def check_settings(cfg: DictConfig) -> tuple[int, list[int]]:
    """Validate the config before any model is built: no ``???`` left, the types of ``eval.*`` and of the
    instantiable groups, the data and model paths (:mod:`grpolab.config_checks`), then ``eval.num_samples``,
    ``eval.ks``, ``eval.split``, ``eval.dataset``, ``eval.batch_size``.

    Returns:
        ``(n, ks)`` with ``ks`` sorted and de-duplicated.

    Raises:
        ConfigError: naming the key at fault (``eval.<key>``, ``data.path``, ``model.path``, ...).
    """
    check_required(cfg)
    e = cfg.eval
    errors = [msg for key, allowed in EVAL_TYPES.items() if key in e
              and (msg := type_error(f"eval.{key}", OmegaConf.select(cfg, f"eval.{key}"), allowed))]
    if errors:
        raise ConfigError("; ".join(errors))
    check_types(cfg, groups=("data", "verifier", "model", "rollout"))
    name = e.get("dataset")
    check_paths(cfg, f"eval_datasets.{name}" if name is not None and name in (cfg.get("eval_datasets") or {})
                else "data")
    n = int(e.num_samples)
    if n < 1:
        raise ConfigError(f"eval.num_samples must be >= 1, got {n}")
    ks = default_ks(n) if e.ks is None else sorted({int(k) for k in e.ks})
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise ConfigError(f"eval.ks must lie in [1, eval.num_samples={n}] (pass@k needs n >= k samples), got {bad}")
    if e.split not in ("train", "val", "test", "all"):
        raise ConfigError(f"eval.split must be train, val, test or all, got {e.split!r}")
    if name is not None and name not in (cfg.get("eval_datasets") or {}):
        raise ConfigError(f"eval.dataset={name!r} is not a key of eval_datasets {sorted(cfg.get('eval_datasets') or {})}")
    if int(e.batch_size) < 1:
        raise ConfigError(f"eval.batch_size must be >= 1, got {e.batch_size}")
    return n, ks


def summarize(records: list[dict], n: int, ks: list[int], threshold: float) -> dict[str, Any]:
    """Metrics from the completion records of :func:`evaluate`.

    Args:
        records: one dict per completion with ``uid``, ``greedy``, ``reward`` (float, NaN = unscorable),
            ``answer_extracted``, ``truncated``, ``length``.
        n: samples per prompt.
        ks: budgets for pass@k and maj@k.
        threshold: reward at or above which a sample is correct.

    Returns:
        ``accuracy`` (= ``mean@n``), ``accuracy_stderr`` (standard error over prompts), ``pass@k`` and
        ``maj@k`` for each k (over prompts with at least k scorable samples), ``greedy_accuracy``,
        ``mean_reward``, ``mean_length`` and ``truncated_ratio`` of the sampled completions (and their
        greedy counterparts), ``num_prompts``, ``num_unscorable``, ``num_prompts_short`` per k (prompts left
        out of pass@k because unscorable samples left fewer than k).
    """
    sampled: dict[str, list[dict]] = {}
    greedy: list[dict] = []
    for r in records:
        (greedy.append(r) if r["greedy"] else sampled.setdefault(r["uid"], []).append(r))
    per_prompt_correct, rewards = [], []
    out: dict[str, Any] = {"num_prompts": len(sampled), "num_samples": n}
    unscorable = 0
    for rows in sampled.values():
        ok = [r for r in rows if not math.isnan(r["reward"])]
        unscorable += len(rows) - len(ok)
        per_prompt_correct.append([1.0 if r["reward"] >= threshold else 0.0 for r in ok])
        rewards.extend(r["reward"] for r in ok)
    out["accuracy"] = mean_at_n(per_prompt_correct)
    out[f"mean@{n}"] = out["accuracy"]
    out["accuracy_stderr"] = standard_error([sum(c) / len(c) for c in per_prompt_correct if c])
    for k in ks:
        p, m, short = [], [], 0
        for rows, correct in zip(sampled.values(), per_prompt_correct):
            if len(correct) < k:
                short += 1
                continue
            p.append(pass_at_k(len(correct), int(sum(correct)), k))
            ok = [r for r in rows if not math.isnan(r["reward"])]
            m.append(maj_at_k([r["answer_extracted"] for r in ok], correct, k))
        out[f"pass@{k}"] = sum(p) / len(p) if p else math.nan
        out[f"maj@{k}"] = sum(m) / len(m) if m else math.nan
        if short:
            out.setdefault("num_prompts_short", {})[str(k)] = short
    out["mean_reward"] = sum(rewards) / len(rewards) if rewards else math.nan
    all_sampled = [r for rows in sampled.values() for r in rows]
    for prefix, rows in (("", all_sampled), ("greedy_", greedy)):
        if rows:
            out[f"{prefix}mean_length"] = sum(r["length"] for r in rows) / len(rows)
            out[f"{prefix}truncated_ratio"] = sum(bool(r["truncated"]) for r in rows) / len(rows)
    if greedy:
        ok = [r for r in greedy if not math.isnan(r["reward"])]
        unscorable += len(greedy) - len(ok)
        out["greedy_accuracy"] = sum(r["reward"] >= threshold for r in ok) / len(ok) if ok else math.nan
    out["num_unscorable"] = unscorable
    return out


def select_rows(task: Any, split: str, max_prompts: int | None = None) -> list[dict]:
    """The rows to score: one split of the task, or ``all`` (train + val + test, for benchmark sets).

    Raises:
        ValueError: if no row is left.
    """
    splits = task.splits()
    rows = splits["train"] + splits["val"] + splits["test"] if split == "all" else list(splits[split])
    if max_prompts is not None:
        rows = rows[: int(max_prompts)]
    if not rows:
        raise ConfigError(f"the {split!r} split of {type(task).__name__} has no rows")
    return rows


def _records(sample: dict[str, Any], extract: Any, threshold: float, greedy: bool, n: int) -> list[dict]:
    gen = sample["generation"]
    lengths = gen.completion_mask.sum(1).tolist()
    out = []
    for i, (row, text, reward) in enumerate(zip(sample["rows"], sample["completions"], sample["rewards"].tolist())):
        scorable = not math.isnan(reward)
        out.append({
            "uid": row["uid"], "sample": i % n, "greedy": greedy, "prompt": row["prompt"], "gold": row["answer"],
            "completion": text, "answer_extracted": extract(text), "reward": reward,
            "correct": (reward >= threshold) if scorable else None, "truncated": bool(gen.truncated[i]),
            "length": int(lengths[i]),
        })
    return out


def _clean(obj: Any) -> Any:
    """NaN -> None recursively, so eval.json is strict JSON."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


def _sample_rows(producer: Any, policy: Any, rows: list[dict], cfg: DictConfig, extract: Any, desc: str) -> list[dict]:
    """``eval.num_samples`` completions (and a greedy one with ``eval.greedy``) of every row, ``eval.batch_size`` prompts
    at a time, as :func:`_records` dicts; a progress bar shows the running accuracy."""
    from tqdm.auto import tqdm

    e = cfg.eval
    n, threshold, records = int(e.num_samples), float(e.correct_threshold), []
    with tqdm(total=len(rows), desc=desc, unit="prompt", disable=not e.progress_bar) as bar:
        for s in range(0, len(rows), int(e.batch_size)):
            batch = rows[s:s + int(e.batch_size)]
            records += _records(producer.sample(policy, batch, n), extract, threshold, False, n)
            if e.greedy:
                records += _records(producer.sample(policy, batch, 1, greedy=True), extract, threshold, True, 1)
            bar.update(len(batch))
            done = [r for r in records if not r["greedy"] and not math.isnan(r["reward"])]
            if done:
                bar.set_postfix(acc=f"{sum(r['correct'] for r in done) / len(done):.3f}")
    return records


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Run the evaluation described by a composed ``conf/eval.yaml`` and write its outputs.

    Returns:
        The content of ``eval.json``.

    The engine is resolved and built as training builds it (:func:`~grpolab.rollout.settings.resolve_rollout`: the
    class, its ``check_config`` and ``check_installed`` before any model is built; no training schedule to check),
    and closed when sampling ends, also on an error (a ``rollout=vllm_server`` server is stopped).

    Raises:
        ValueError: on invalid ``eval.*`` or ``rollout.*`` settings (before any model is built); see
            :func:`load_policy`.
    """
    from grpolab.rollout.producer import RolloutProducer

    start = time.perf_counter()
    n, ks = check_settings(cfg)
    _, engine_args, _ = resolve_rollout(OmegaConf.to_container(cfg.rollout, resolve=True), None)
    e = cfg.eval
    threshold = float(e.correct_threshold)
    out_dir = Path(e.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.get("ckpt_path") and OmegaConf.select(cfg, "model.warmstart") is not None:
        with open_dict(cfg):
            cfg.model.warmstart = None  # the checkpoint supplies the weights: build the bare architecture
    benchmark = e.get("dataset")
    task = instantiate(cfg.eval_datasets[benchmark] if benchmark else cfg.data)
    split = "all" if benchmark else e.split
    verifier = instantiate(cfg.verifier)
    spec = instantiate(cfg.model)
    rows = select_rows(task, split, e.max_prompts)
    run = run_folder(cfg)
    run_info = check_run_data(cfg, run) if run is not None and not benchmark else None
    tokenizer = spec.load_tokenizer()
    spec.check_text(task, tokenizer, {split: rows})  # the tiny model's vocabulary covers the rows sampled
    policy = load_policy(cfg, spec, task).to(_device(e.device))
    policy.eval()
    engine = instantiate(engine_args, stop_token_ids=spec.stop_token_ids(tokenizer), pad_token_id=tokenizer.pad_token_id)
    try:
        engine.sync_weights(policy, 0)  # an engine that owns its weights samples from its copy
        producer = RolloutProducer(build_sampling(cfg), task, tokenizer, engine, verifier, needs_sampler_logp=False)
        torch.manual_seed(int(e.seed))  # after the model is built (building one may reseed the global RNG)
        records = _sample_rows(producer, policy, rows, cfg, answer_extractor(verifier), f"eval {benchmark or split}")
    finally:
        engine.close()  # what the engine started (a server, a vLLM engine) ends with the evaluation
    result: dict[str, Any] = {
        "model": str(getattr(spec, "source", OmegaConf.select(cfg, "model._target_"))),
        "ckpt_path": cfg.get("ckpt_path"),
        "data": str(OmegaConf.select(cfg, "data._target_")),
        "verifier": list(getattr(verifier, "names", [])),
        "dataset": benchmark,
        "split": split,
        "seed": int(cfg.seed),
        "sampling_seed": int(e.seed),
        "temperature": float(e.temperature),
        "max_new_tokens": int(e.max_new_tokens),
        "ks": ks,
        **summarize(records, n, ks, threshold),
    }
    if run_info is not None:
        result["run"] = run_info
    result["time_s"] = round(time.perf_counter() - start, 2)
    result = _clean(result)
    write_json(out_dir / "eval.json", result)  # atomic: a reader never sees half of it
    if e.save_completions:
        with (out_dir / "completions.jsonl").open("w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(_clean(r), ensure_ascii=False) + "\n")
    log.info("eval: %s", json.dumps({k: v for k, v in result.items() if k != "run"}))
    if run_info and run_info.get("val_accuracy_end") is not None:
        log.info("run %s: summary.json val_accuracy_end=%s (val split); here accuracy=%.4f +- %.4f (%s split)",
                 run, run_info["val_accuracy_end"], result["accuracy"], result["accuracy_stderr"] or 0.0, split)
    return result
