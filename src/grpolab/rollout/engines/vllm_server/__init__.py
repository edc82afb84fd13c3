"""``rollout=vllm_server``: a vLLM server in its own process as the sampler.

:mod:`.process` starts, watches and stops the server process and is its HTTP client; :mod:`.settings` holds the
``rollout.server.*`` settings and their checks; :mod:`.transport` pushes the policy's weights into the server;
:mod:`.guards` checks the server's answers; :mod:`.engine` is the :class:`~grpolab.rollout.engines.base.GenerationEngine`
that ties them together.
"""
