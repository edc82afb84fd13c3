"""Checks on a vLLM server's answers: a stale sampler cannot pass (every sampled token labelled with the promised
weight version)."""

from __future__ import annotations

from typing import Any

from grpolab.rollout.engines.vllm_server.process import ServerError


def check_weight_versions(choice: dict[str, Any], label: str | None, num_tokens: int, url: str) -> None:
    """The stale-sampler guard on one answer of ``/inference/v1/generate``: every sampled token must carry the
    weight version ``label`` promised by the last push.

    Args:
        choice: ``answer["choices"][0]``, whose ``weight_versions`` is a list of ``{"version", "start", "end"}``
            spans over the output tokens (vLLM >= 0.32's token-in/token-out endpoint, ``--enable-scale-out``).
        label: the version the server was promised. num_tokens: tokens sampled. url: the server, for the message.

    Raises:
        ServerError: the answer has no ``weight_versions`` (a build or server that does not report them: the guard
            cannot pass vacuously), its spans do not cover every token, or a token was sampled with another label.
    """
    spans = choice.get("weight_versions")
    if spans is None or (num_tokens and not spans):
        raise ServerError(f"the vLLM server at {url} answered without weight_versions, so a stale sampler could not "
                          "be detected: rollout=vllm_server needs a vLLM >= 0.32 server started with "
                          "--enable-scale-out and VLLM_SERVER_DEV_MODE=1 (what a server the run starts uses; set "
                          "them on the server given by rollout.server.url)")
    versions = {span.get("version") for span in spans}
    covered = sum(int(span.get("end", 0)) - int(span.get("start", 0)) for span in spans)
    if versions - {label}:
        raise ServerError(f"the server sampled with weights {sorted(map(str, versions))} but was promised {label!r} "
                          "(a stale or foreign sampler)")
    if covered != num_tokens:
        raise ServerError(f"the vLLM server at {url} labelled {covered} of {num_tokens} sampled tokens with a weight "
                          "version (weight_versions); a stale sampler could not be excluded")
