"""The embedded tiny model's character-level tokenizer, and the check that it covers a task's text.

One token per character: ids 0-2 are ``<pad>``, ``<eos>``, ``<unk>``, then :data:`CHAR_VOCAB` (digits, ``+-*=().,``
and space, ids 3-21), then the characters of ``model.extra_chars`` in their order.

The pipeline is the one transformers' ``Qwen2Tokenizer`` builds (NFC, Qwen2's split regex, byte-level pieces,
byte-level BPE; no unknown token). A saved ``policy/`` holds a qwen2 ``config.json``, and ``AutoTokenizer`` (so
TRL and vLLM too) loads any qwen2 folder as ``Qwen2Tokenizer``, which rebuilds that pipeline from the vocabulary
and merges of ``tokenizer.json`` whatever pipeline the file describes. A character-level tokenizer with another
pipeline (the former WordLevel one) then lost every space and every character it did not know; this one reloads
with the same ids for any text. A character is one token: its byte-level form, merged from its bytes (a
character of several UTF-8 bytes also puts its byte pieces in the vocabulary).

Without an unknown token a character outside the vocabulary is dropped (or leaves a stray byte piece), as by
Qwen2's tokenizer, so :func:`check_covers` refuses such data before any step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from grpolab.errors import ConfigError, VocabularyError

CHAR_VOCAB = list("0123456789+-*=()., ")
CHAR_SPECIALS = ["<pad>", "<eos>", "<unk>"]

# transformers' Qwen2Tokenizer: its split regex, then byte-level pieces without a prefix space
QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                           r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
_BYTE_LEVEL = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)


def char_vocab(extra_chars: str | list[str] | None = None) -> list[str]:
    """The tiny model's characters: :data:`CHAR_VOCAB`, then those of ``extra_chars`` not already in it, in order.

    Args:
        extra_chars: ``model.extra_chars``, a string (``"abc?"``) or a list of one-character strings; None = none.

    Returns:
        The characters, one per token id from 3 on (the ids of :data:`CHAR_VOCAB` never change).

    Raises:
        ConfigError: naming ``model.extra_chars`` when it is not a string or a list of single characters.
    """
    if extra_chars is None:
        return list(CHAR_VOCAB)
    if not isinstance(extra_chars, str):
        extra_chars = list(extra_chars) if isinstance(extra_chars, list | tuple) else extra_chars
        if not (isinstance(extra_chars, list) and all(isinstance(c, str) and len(c) == 1 for c in extra_chars)):
            raise ConfigError(f"model.extra_chars must be a string of characters (e.g. 'abc?') or a list of single "
                              f"characters, got {extra_chars!r}")
    return list(dict.fromkeys([*CHAR_VOCAB, *extra_chars]))


def build_char_tokenizer(chars: list[str] | None = None) -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer: one token per character of ``chars`` (default :data:`CHAR_VOCAB`), after
    ``<pad>``=0, ``<eos>``=1, ``<unk>``=2 (kept for the ids; never produced). Left padding.

    ``save_pretrained`` then ``AutoTokenizer.from_pretrained`` (next to a qwen2 or any ``config.json``) gives a
    tokenizer with the same ids and decoding for any text (see the module docstring).

    Args:
        chars: distinct single characters, e.g. :func:`char_vocab`'s list.

    Raises:
        ValueError: if ``chars`` repeats a character or holds a string that is not one character.
    """
    chars = list(CHAR_VOCAB if chars is None else chars)
    if len(set(chars)) != len(chars) or not all(isinstance(c, str) and len(c) == 1 for c in chars):
        raise ValueError(f"build_char_tokenizer: chars must be distinct single characters, got {chars!r}")
    vocab = {t: i for i, t in enumerate(CHAR_SPECIALS)}
    merges: list[tuple[str, str]] = []
    for ch in chars:
        pieces = _BYTE_LEVEL.pre_tokenize_str(ch)[0][0]  # one byte-level symbol per UTF-8 byte (" " -> "Ġ")
        merged = pieces[0]
        for piece in pieces[1:]:  # several bytes: each prefix is a token, merged with the next byte
            vocab.setdefault(merged, len(vocab))
            vocab.setdefault(piece, len(vocab))
            merges.append((merged, piece))
            merged += piece
        vocab.setdefault(merged, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                                   continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                                   byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False), _BYTE_LEVEL])
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   padding_side="left")  # saved in tokenizer_config.json: a reload pads left too


def _representable(tokenizer: Any, ch: str) -> bool:
    ids = tokenizer(ch, add_special_tokens=False)["input_ids"]
    return len(ids) == 1 and tokenizer.decode(ids) == ch


def check_covers(task: Any, tokenizer: Any, splits: dict[str, list[dict]] | None = None,
                 fix: Callable[[list[str]], str] | None = None) -> None:
    """Refuse data with a character the character-level ``tokenizer`` cannot represent as one token of its own.

    Every row's prompt, as the sampler formats it (``task.format_prompt``: instruction and all), and its gold
    answer are checked, after the tokenizer's normalizer (NFC).

    Args:
        task: the task (``splits()``, ``format_prompt``, ``name``).
        tokenizer: a tokenizer from :func:`build_char_tokenizer` (or one reloaded from its folder).
        splits: ``{split name: rows}`` to check; None = every split of ``task.splits()``.
        fix: ``missing characters (sorted) -> what to do about it``, appended to the message.

    Raises:
        VocabularyError: naming the first row (split, index in the split, uid, prompt or answer) holding such a
            character, the character (repr), and every such character of the data.
    """
    splits = task.splits() if splits is None else splits
    normalizer = getattr(getattr(tokenizer, "backend_tokenizer", None), "normalizer", None)
    known: dict[str, bool] = {}
    missing: dict[str, tuple[str, int, str, str]] = {}
    for split, rows in splits.items():
        for i, row in enumerate(rows or []):
            for field, text in (("prompt", task.format_prompt(row, tokenizer)), ("answer", str(row["answer"]))):
                for ch in dict.fromkeys(normalizer.normalize_str(text) if normalizer else text):
                    if ch not in known:
                        known[ch] = _representable(tokenizer, ch)
                    if not known[ch] and ch not in missing:
                        missing[ch] = (split, i, str(row["uid"]), field)
    if missing:
        ch, (split, i, uid, field) = next(iter(missing.items()))
        raise VocabularyError(
            f"{getattr(task, 'name', 'data')}: the {field} of row {i} of split {split} (uid {uid!r}) has the character "
            f"{ch!r}, which the tiny model's character vocabulary does not hold (its tokenizer would drop it); the "
            f"data has {len(missing)} such character(s): {sorted(missing)!r}. {fix(sorted(missing)) if fix else ''}"
            .rstrip())


def extend_hint(extra_chars: list[str], missing: list[str]) -> str:
    """The fix :class:`~grpolab.models.TinyCharModel` names: the ``model.extra_chars`` that covers ``missing`` (its
    override when every character can be written in one), or a model with a real tokenizer.

    Args:
        extra_chars: the characters ``model.extra_chars`` already adds.
        missing: the characters the data needs.
    """
    chars = "".join(dict.fromkeys([*extra_chars, *missing]))
    writable = chars.isprintable() and not set(chars) & set("'\"\\$`!")  # inside '...' inside "..." (shell)
    example = f"the command line: \"model.extra_chars='{chars}'\"" if writable else (
        "the command line, e.g. \"model.extra_chars='abc?'\"")
    return (f"Add them to model.extra_chars (conf/model/tiny.yaml, or {example}; new "
            "characters get new ids, after the others, and a new warm start), or use a model with a real tokenizer "
            "(model=tiny_qwen, model=qwen0.5b)")


def exported_policy_hint(path: str) -> str:
    """The fix named when a run's exported tokenizer (``model.path``) cannot represent the data's characters."""
    return (f"The tokenizer comes from model.path={path}: a run with model.extra_chars covering them exports one that "
            "holds them (a policy/ exported by an earlier grpolab drops every space: evaluate its run's checkpoint "
            "with ckpt_path= instead)")
