"""Errors that stop a run with a message naming the step and the quantity at fault."""


class NonFiniteLossError(RuntimeError):
    """A loss, gradient norm, weight or sampling distribution became NaN/inf. Raised before the optimizer
    step (or before sampling) so the last saved checkpoint is still good."""
