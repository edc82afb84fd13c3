"""The tiny model's character tokenizer reloads from a saved folder with the same ids (issue 40), keeps the ids of
the built-in tasks, and data with a character outside its vocabulary is refused before any step."""

import json

import pytest
from conftest import FAST_OVERRIDES, compose_train_cfg
from transformers import AutoTokenizer, Qwen2Config

from grpolab.app.run import run_training
from grpolab.char_tokenizer import CHAR_SPECIALS, CHAR_VOCAB, build_char_tokenizer, char_vocab
from grpolab.errors import ConfigError, VocabularyError
from grpolab.models import TinyCharModel
from grpolab.tasks.arithmetic import ArithmeticTask
from grpolab.tasks.jsonl import JsonlTask
from grpolab.tasks.multistep import MultiStepArithmeticTask

LETTERS = "abcdefghijklmnopqrstuvwxyzHW?!'"
TEXTS = ["what is 3*4?", "Hello World", " 1  +  2 = 3 ", "(1.5, 2)", "it's 12-7.", "", "wow!! 3*(4+5)=27"]


@pytest.mark.parametrize("extra,texts", [(LETTERS, TEXTS), (LETTERS + "é€😀", ["café 3€ 😀!", "é"])],
                         ids=["ascii", "multibyte"])
def test_saved_tokenizer_reloads_with_the_same_ids_next_to_a_qwen2_config(tmp_path, extra, texts):
    tok = build_char_tokenizer(char_vocab(extra))
    tok.save_pretrained(tmp_path)
    Qwen2Config(vocab_size=len(tok)).save_pretrained(tmp_path)  # as in a run's policy/: AutoTokenizer then
    reloaded = AutoTokenizer.from_pretrained(tmp_path)  # builds Qwen2Tokenizer from the vocabulary and merges
    assert len(reloaded) == len(tok) and reloaded.eos_token_id == tok.eos_token_id == 1
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert reloaded(text, add_special_tokens=False)["input_ids"] == ids, text
        assert len(ids) == len(text)  # one token per character
        assert tok.decode(ids) == reloaded.decode(ids) == text
        assert reloaded.decode(ids + [1], skip_special_tokens=True) == text
    batch = [tok(TEXTS[:2], padding=True)["input_ids"], reloaded(TEXTS[:2], padding=True)["input_ids"]]
    assert batch[0] == batch[1]


def test_the_built_in_tasks_keep_their_token_ids():
    ids_before = {c: i for i, c in enumerate(CHAR_SPECIALS + CHAR_VOCAB)}  # the former WordLevel tokenizer's ids
    tok = build_char_tokenizer(char_vocab("xyz"))  # extra characters come after: the others keep their ids
    rows = ArithmeticTask(operations="+-*", val_size=4, test_size=4).load_rows()[:200]
    rows += MultiStepArithmeticTask(num_terms=5, operations="+-", num_problems=200, val_size=4, test_size=4).load_rows()
    for row in rows:
        for text in (row["prompt"], row["answer"]):
            assert tok(text, add_special_tokens=False)["input_ids"] == [ids_before[c] for c in text]
    assert len(build_char_tokenizer()) == len(ids_before) == 22


def test_extra_chars_must_be_single_characters():
    assert char_vocab(["a", "b", "1"]) == [*CHAR_VOCAB, "a", "b"]
    with pytest.raises(ConfigError, match=r"model\.extra_chars must be a string of characters"):
        TinyCharModel(extra_chars=["ab"])


def _jsonl(path, n=40):
    rows = [{"prompt": f"what is {i % 7} plus {i % 5}?", "answer": str(i % 7 + i % 5)} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["data=jsonl", f"data.path={path}", "data.val_size=4", "data.test_size=8"]


def test_a_character_outside_the_vocabulary_is_named_before_training(tmp_path):
    task = JsonlTask(path=_jsonl(tmp_path / "d.jsonl")[1].split("=", 1)[1], val_size=4, test_size=8)
    spec = TinyCharModel(warmstart=None)
    with pytest.raises(VocabularyError, match=r"jsonl: the prompt of row 0 of split train \(uid 'jsonl/train/\d+'\) "
                                              r"has the character 'w'.* 10 such character\(s\): \['\?', 'a', 'h', "):
        spec.check_text(task, spec.load_tokenizer())
    with pytest.raises(VocabularyError, match=r"\"model\.extra_chars='\?ahilpstuw'\""):
        run_training(compose_train_cfg(tmp_path / "run", [*FAST_OVERRIDES, *_jsonl(tmp_path / "d.jsonl")]))
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "metrics.csv").exists()
    covered = TinyCharModel(warmstart=None, extra_chars="?ahilpstuw")
    covered.check_text(task, covered.load_tokenizer())
    answer = {"prompt": "1+1=", "answer": "two", "uid": "r"}
    with pytest.raises(VocabularyError, match=r"the answer of row 0 of split test \(uid 'r'\) has the character 't'"):
        spec.check_text(task, spec.load_tokenizer(), {"test": [answer]})


def test_eval_of_the_exported_policy_matches_the_checkpoint_on_text_with_letters(tmp_path):
    from grpolab.evaluation.evaluate import evaluate

    data = [*_jsonl(tmp_path / "d.jsonl"), "model.extra_chars='?ahilpstuw'", "verifier=exact"]
    run_training(compose_train_cfg(tmp_path / "run", [*FAST_OVERRIDES, *data, "trainer.max_steps=2",
                                                      "val.at_start=false"]))
    common = [*[o for o in FAST_OVERRIDES if o.startswith(("model.", "data."))], *data, "eval.progress_bar=false",
              "eval.num_samples=2", "eval.max_prompts=8"]
    by_ckpt = evaluate(compose_train_cfg(tmp_path / "e1", [*common, f"ckpt_path={tmp_path}/run/checkpoints/last.ckpt"],
                                         config_name="eval"))
    by_export = evaluate(compose_train_cfg(tmp_path / "e2", [*common, f"model.path={tmp_path}/run/policy"],
                                           config_name="eval"))
    assert by_ckpt["accuracy"] == by_export["accuracy"] and by_ckpt["mean_length"] == by_export["mean_length"]
    # the same prompts, token for token: the same completions (with the former tokenizer they all differed)
    completions = [(tmp_path / e / "completions.jsonl").read_text().splitlines() for e in ("e1", "e2")]
    assert completions[0] == completions[1] and len(completions[0]) == 8 * 3
