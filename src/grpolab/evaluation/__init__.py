"""Evaluation: accuracy estimators (mean@n, pass@k, maj@k) and the run behind ``src/eval.py``."""

from grpolab.evaluation.metrics import maj_at_k, majority_vote, mean_at_n, pass_at_k, standard_error

__all__ = ["maj_at_k", "majority_vote", "mean_at_n", "pass_at_k", "standard_error"]
