"""Generation engines: the interface every sampler implements (:mod:`.base`) and its implementations.

``hf`` samples on the live policy with Hugging Face models (our decode loop in :mod:`.decode` on the KV cache of
:mod:`.kv_cache`, or ``generate``); ``hf_copy`` samples on a copy of the policy it owns; ``vllm`` is a colocated
in-process vLLM engine (its start-up check in :mod:`.vllm_check`, its output conversion in :mod:`.completions`);
:mod:`.vllm_server` is a vLLM server in its own process. Engines import the shared forward pass
(:mod:`grpolab.forward`) and the maths (:mod:`grpolab.algo`), never the rollout schedule above them.
"""
