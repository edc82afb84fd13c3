"""2-process training on the CPU (gloo), launched as a user does: ``python src/train.py trainer=ddp|fsdp``.

One DDP run (a module fixture) serves the disjoint-groups, metrics and FSDP checks."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import torch
from ddp_helpers import COMMON, STEPS, G, _weights, train
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="2 CPU processes need 2 cores")


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp") / "run"
    res = train(out, "trainer=ddp", *COMMON, "trainer.log_every_n_steps=1")
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.mark.slow
def test_two_process_ddp_trains_disjoint_whole_groups_and_keeps_ranks_identical(ddp_run):
    out = ddp_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == STEPS
    # only rank 0 writes the run folder (rank 1 logs to its own file and stops before the outputs)
    assert "summary:" in (out / "train.log").read_text()
    assert "summary:" not in (out / "train_ddp_process_1.log").read_text()
    rows = {r: [json.loads(x) for x in (out / "audit" / f"rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)}
    assert [len(rows[r]) for r in (0, 1)] == [STEPS, STEPS]
    for step in range(STEPS):
        uids = [rows[r][step]["uids"] for r in (0, 1)]
        # every group is whole on one rank (num_generations completions of each prompt) ...
        assert all(set(Counter(u).values()) == {G} for u in uids)
        # ... and the ranks sample disjoint prompts
        assert not set(uids[0]) & set(uids[1])
    # 8 completions per rank in micro-batches of 4: DDP all-reduces the (one-bucket) gradient once per
    # optimizer step, after the last micro-batch (no_sync on the others)
    assert [row["allreduces"] for r in (0, 1) for row in rows[r]] == [1] * (2 * STEPS)
    seen = [set(u for row in rows[r] for u in row["uids"]) for r in (0, 1)]
    assert not seen[0] & seen[1]
    w0, w1 = _weights(out, 0), _weights(out, 1)
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    assert not json.loads((out / "audit" / "rank0.json").read_text())["sharded"]
    exported = AutoModelForCausalLM.from_pretrained(out / "policy").state_dict()
    assert all(torch.equal(exported[k], w0[k]) for k in w0)


def _mean(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept)


@pytest.mark.slow
def test_ddp_logs_metrics_of_both_ranks_and_sums_the_counters(ddp_run):
    # train/* metrics and summary.json's counters are the whole global batch's, not rank 0's
    out = ddp_run
    rows = {r: [json.loads(x) for x in (out / "audit" / f"rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)}
    steps = len(rows[0])
    metrics = pd.read_csv(out / "metrics.csv").dropna(subset=["train/loss"]).set_index("step")
    assert metrics.index.tolist() == list(range(steps))
    tokens = 0
    rank0_differs = False
    for s in range(steps):
        pooled = rows[0][s]["rewards"] + rows[1][s]["rewards"]  # every row of the global batch
        expected = _mean(pooled)
        assert metrics.loc[s, "train/reward"] == pytest.approx(expected, rel=1e-6, abs=1e-7), s
        rank0_differs |= abs(_mean(rows[0][s]["rewards"]) - expected) > 1e-6
        lengths = rows[0][s]["lengths"] + rows[1][s]["lengths"]
        assert metrics.loc[s, "train/completions/mean_length"] == pytest.approx(sum(lengths) / len(lengths), rel=1e-6)
        tokens += rows[0][s]["tokens"] + rows[1][s]["tokens"]
        assert metrics.loc[s, "train/num_tokens"] == tokens  # a count: summed over ranks
    assert rank0_differs, "the ranks drew equal rewards: this run cannot tell the global mean from rank 0's"
    summary = json.loads((out / "summary.json").read_text())
    counters = [json.loads((out / "audit" / f"rank{r}_counters.json").read_text()) for r in (0, 1)]
    for key in ("completions", "unscorable", "truncated"):
        assert summary[key] == counters[0][key] + counters[1][key], key
    assert counters[1]["completions"] > 0 and summary["completions"] > counters[0]["completions"]


@pytest.mark.slow
def test_two_process_fsdp2_matches_ddp(ddp_run, tmp_path):
    # FSDP2 shards every decoder layer over the 2 ranks; with the same data and loss normalisation the
    # final weights must match DDP's up to float reduction order.
    out = tmp_path / "run"
    res = train(out, "trainer=fsdp", *COMMON)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["world_size"] == 2
    assert all(json.loads((out / "audit" / f"rank{r}.json").read_text())["sharded"] for r in (0, 1))
    ddp = _weights(ddp_run, 0)
    full0, full1 = _weights(out, 0), _weights(out, 1)  # iter_full_parameters gathers the shards on each rank
    assert full0.keys() == ddp.keys()
    assert all(torch.equal(full0[k], full1[k]) for k in full0)
    for k in ddp:
        torch.testing.assert_close(full0[k], ddp[k], rtol=1e-4, atol=1e-5)
    exported = AutoModelForCausalLM.from_pretrained(out / "policy").state_dict()
    assert all(torch.equal(exported[k], full0[k]) for k in full0)
    assert (out / "checkpoints" / "last.ckpt").is_file()
