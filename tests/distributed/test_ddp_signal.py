"""Two gloo ranks: SIGTERM to rank 0 alone (``kill <pid>``) during the validation at start stops both ranks, with
no hang in a collective (Lightning's own SIGTERM handler would broadcast from inside the handler) and the outputs
of an interrupted run."""

import json
import os
import signal

import pytest
from test_interrupt_phases import _signal_at

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="2 CPU processes need 2 cores")


@pytest.mark.slow
def test_sigterm_to_rank_0_during_the_start_validation_stops_both_ranks(tmp_path):
    out = tmp_path / "ddp"
    rc, output = _signal_at(out, "start validation at step 0", signal.SIGTERM, False, "trainer=ddp",
                            "trainer.devices=2", "val.at_start=true", "trainer.max_steps=1000")
    assert rc == 143, output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["steps"] == 0 and summary["world_size"] == 2
    assert summary["stopped_in"] == "start validation"
    assert (out / "policy" / "model.safetensors").exists()
