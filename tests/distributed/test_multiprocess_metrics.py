"""Under DDP the logged train/* metrics and summary.json's counters are the whole global batch's, not rank 0's:
two gloo processes that see different rows (launched as a user does, ``python src/train.py trainer=ddp``)."""

from __future__ import annotations

import json
import math
import os

import pandas as pd
import pytest
from ddp_helpers import COMMON, train

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="2 CPU processes need 2 cores")


def _mean(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept)


@pytest.mark.slow
def test_ddp_logs_metrics_of_both_ranks_and_sums_the_counters(tmp_path):
    out = tmp_path / "run"
    res = train(out, "trainer=ddp", *COMMON, "trainer.log_every_n_steps=1", "val.at_start=false", "save_policy=false")
    assert res.returncode == 0, res.stderr[-3000:]
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
