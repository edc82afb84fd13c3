"""Errors that stop a run with a message naming the step, the quantity or the config key at fault."""


class NonFiniteLossError(RuntimeError):
    """A loss, gradient norm, weight or sampling distribution became NaN/inf. Raised before the optimizer
    step (or before sampling) so the last saved checkpoint is still good."""


class ConfigError(ValueError):
    """A user error in the composed config: a wrong value or type, a missing required key or file, or settings
    that conflict. The message is one sentence that names the key (``trainer.max_steps``) and the fix.

    ``src/train.py`` and ``src/eval.py`` print it as one line on stderr, without a traceback, and exit with
    status 2 (:func:`grpolab.app.cli.user_errors`); ``GRPOLAB_TRACEBACK=1`` or ``HYDRA_FULL_ERROR=1`` brings the
    traceback back. A ``ValueError``, so callers that catch ``ValueError`` keep working.
    """


class ConfigPathError(ConfigError, FileNotFoundError):
    """A :class:`ConfigError` for a file or folder named in the config that does not exist (``data.path``,
    ``model.path``, ``ckpt_path``); also a ``FileNotFoundError``."""


class VocabularyError(ConfigError):
    """A :class:`ConfigError` for data the model's tokenizer cannot represent: a character of a prompt or a gold
    answer that the embedded tiny model's character vocabulary does not hold (its tokenizer would drop it). The
    message names the split, the row, the character and ``model.extra_chars``, the key that extends the vocabulary."""
