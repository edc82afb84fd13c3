"""A rank that dies stops the others: the run exits with an error instead of hanging."""

import os

import pytest
from ddp_helpers import train

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="2 CPU processes need 2 cores")


@pytest.mark.slow
@pytest.mark.parametrize("dead", [1, 0])
def test_a_dead_rank_stops_the_run(tmp_path, dead):
    out = tmp_path / "run"
    res = train(out, "trainer=ddp", "trainer.devices=2", "trainer.max_steps=6", "val.at_start=false",
                "+callbacks.audit._target_=rank_audit.RankAudit", f"+callbacks.audit.die_rank={dead}",
                "+callbacks.audit.die_at_step=2", timeout=120)  # raises TimeoutExpired if it hangs
    assert res.returncode != 0
    assert not (out / "summary.json").exists()
