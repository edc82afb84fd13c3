"""The shared forward pass: (prompt, completion) token ids -> per-token log-probs, used by the trainer, the rollout
producer, the engines' checks and Theorem 1's diagnostics.

:mod:`.logprob_pass` is the pass itself, :mod:`.shared_prompt` runs each distinct prompt once under its group's
completions, :mod:`.buckets` splits micro-batches by completion length, :mod:`.theorem1` evaluates the Theorem 1
lower bound with it. It imports the maths (:mod:`grpolab.algo`) and nothing of the rollout package above it.
"""
