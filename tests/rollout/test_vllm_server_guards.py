"""The stale-sampler guard of rollout=vllm_server on answers shaped as vLLM 0.32's /inference/v1/generate returns
them (a choice's ``weight_versions`` spans over the output tokens); needs no vLLM."""

from __future__ import annotations

import pytest

from grpolab.rollout.engines.vllm_server.guards import check_weight_versions
from grpolab.rollout.engines.vllm_server.process import ServerError

URL = "http://127.0.0.1:8000"


def _choice(spans):
    return {"index": 0, "token_ids": [5, 6, 7], "weight_versions": spans}


def test_an_answer_labelled_with_the_promised_version_passes():
    check_weight_versions(_choice([{"version": "step2-push2", "start": 0, "end": 3}]), "step2-push2", 3, URL)


@pytest.mark.parametrize("choice", [{"index": 0, "token_ids": [5, 6, 7]}, _choice(None), _choice([])],
                         ids=["no field", "null", "empty"])
def test_an_answer_without_weight_versions_is_refused_naming_the_flag(choice):
    # before: a server that does not report versions passed the guard vacuously
    with pytest.raises(ServerError, match=r"without weight_versions.*--enable-scale-out.*rollout\.server\.url"):
        check_weight_versions(choice, "step2-push2", 3, URL)


def test_a_token_of_other_weights_or_unlabelled_tokens_are_refused():
    spans = [{"version": "step2-push2", "start": 0, "end": 2}, {"version": "step0-push1", "start": 2, "end": 3}]
    with pytest.raises(ServerError, match=r"sampled with weights \['step0-push1', 'step2-push2'\]"):
        check_weight_versions(_choice(spans), "step2-push2", 3, URL)
    with pytest.raises(ServerError, match=r"labelled 2 of 3 sampled tokens"):
        check_weight_versions(_choice([{"version": "step2-push2", "start": 0, "end": 2}]), "step2-push2", 3, URL)
