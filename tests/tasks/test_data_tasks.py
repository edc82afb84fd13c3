"""GSM8K, MATH-500 and JSONL tasks on real files, and every way a data file can be wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from grpolab.tasks.gsm8k import GSM8KTask, gsm8k_gold
from grpolab.tasks.jsonl import JsonlTask
from grpolab.tasks.loading import read_local, strip_calculator_annotations
from grpolab.tasks.math import MathTask

CONF = Path(__file__).resolve().parents[2] / "conf" / "data"


@pytest.fixture(scope="module")
def gsm8k(shared_data):
    return GSM8KTask(
        path=str(shared_data / "gsm8k" / "train.jsonl"), test_path=str(shared_data / "gsm8k" / "test.jsonl")
    )


# ---------------------------------------------------------------------------------------------- GSM8K
def test_gsm8k_rows(gsm8k):
    splits = gsm8k.splits()
    assert {k: len(v) for k, v in splits.items()} == {"train": 7473 - 64, "val": 64, "test": 1319}
    first = next(r for r in splits["test"] if r["uid"] == "gsm8k/test/0")
    assert first["prompt"].startswith("Janet’s ducks lay 16 eggs per day.")
    assert first["answer"] == "18"
    assert "<<" not in first["solution"] and first["solution"].endswith("#### 18")
    rows = [r for split in splits.values() for r in split]
    assert all("," not in r["answer"] and "<<" not in r["solution"] for r in rows)
    assert sum(r["answer"].startswith("-") for r in rows) == 5
    assert {r["answer"] for r in rows if r["uid"] == "gsm8k/test/1"} == {"3"}


def test_gsm8k_splits_are_seeded_and_disjoint(shared_data):
    path = str(shared_data / "gsm8k" / "test.jsonl")
    a = GSM8KTask(path=path, val_size=50, test_size=100, seed=1).splits()
    b = GSM8KTask(path=path, val_size=50, test_size=100, seed=1).splits()
    c = GSM8KTask(path=path, val_size=50, test_size=100, seed=2).splits()
    assert [r["uid"] for r in a["val"]] == [r["uid"] for r in b["val"]]
    assert [r["uid"] for r in a["val"]] != [r["uid"] for r in c["val"]]
    uids = [r["uid"] for split in a.values() for r in split]
    assert len(uids) == len(set(uids)) == 1319
    assert {k: len(v) for k, v in a.items()} == {"train": 1169, "val": 50, "test": 100}


def test_gsm8k_gold_and_annotations():
    assert gsm8k_gold("... = $<<2*1000=2000>>2,000.\n#### 2,000") == "2000"
    assert gsm8k_gold("no marker") is None
    assert strip_calculator_annotations("16 - 3 - 4 = <<16-3-4=9>>9 eggs") == "16 - 3 - 4 = 9 eggs"


def test_gsm8k_row_without_marker_names_file_row_and_key(tmp_path):
    path = tmp_path / "g.jsonl"
    lines = [{"question": "q0", "answer": "x\n#### 1"}, {"question": "q1", "answer": "forgot the marker"}]
    path.write_text("\n".join(json.dumps(x) for x in lines))
    with pytest.raises(ValueError, match=r"g\.jsonl: row 1: 'answer' has no final answer after '####'"):
        GSM8KTask(path=str(path), val_size=0, test_size=0).splits()


# ----------------------------------------------------------------------------------------------- MATH
def test_math500_rows(shared_data):
    task = MathTask(
        name="math500", path=str(shared_data / "math500" / "test.jsonl"), val_size=100, test_size=300
    )
    splits = task.splits()
    assert {k: len(v) for k, v in splits.items()} == {"train": 100, "val": 100, "test": 300}
    row = next(r for split in splits.values() for r in split if r["uid"] == "math500/train/0")
    assert row["prompt"].startswith("Convert the point $(0,3)$")
    assert row["answer"] == r"\left( 3, \frac{\pi}{2} \right)"
    assert row["unique_id"] == "test/precalculus/807.json" and row["level"] == 2 and "solution" in row
    assert "problem" not in row  # the problem is the prompt


# ---------------------------------------------------------------------------------------------- JSONL
def _write_jsonl(path: Path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_jsonl_task_keys_uids_and_extra_columns(tmp_path):
    records = [{"id": f"q{i}", "q": f"{i}+{i}=", "a": 2 * i, "topic": "add"} for i in range(10)]
    task = JsonlTask(
        path=_write_jsonl(tmp_path / "d.jsonl", records),
        prompt_key="q",
        answer_key="a",
        uid_key="id",
        val_size=2,
        test_size=3,
    )
    splits = task.splits()
    assert {k: len(v) for k, v in splits.items()} == {"train": 5, "val": 2, "test": 3}
    row = next(r for s in splits.values() for r in s if r["uid"] == "q4")
    assert row == {"uid": "q4", "prompt": "4+4=", "answer": "8", "topic": "add"}


def test_jsonl_reserved_column_names_are_renamed(tmp_path):
    records = [{"prompt": "p", "answer": "1", "completions": "x", "truncated": True}]
    row = JsonlTask(path=_write_jsonl(tmp_path / "d.jsonl", records), val_size=0, test_size=0).splits()[
        "train"
    ][0]
    assert row == {
        "uid": "jsonl/train/0",
        "prompt": "p",
        "answer": "1",
        "source_completions": "x",
        "source_truncated": True,
    }


def test_parquet_and_json_files(tmp_path):
    records = [{"prompt": f"p{i}", "answer": str(i)} for i in range(4)]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "d.parquet")
    (tmp_path / "d.json").write_text(json.dumps(records))
    assert read_local(tmp_path / "d.parquet") == records
    assert read_local(tmp_path / "d.json") == records
    splits = JsonlTask(path=str(tmp_path / "d.parquet"), val_size=1, test_size=1).splits()
    assert sorted(r["answer"] for s in splits.values() for r in s) == ["0", "1", "2", "3"]


@pytest.mark.parametrize(
    "content, kwargs, error, match",
    [
        ("", {}, ValueError, r"bad\.jsonl: the file has no rows"),
        ("\n\n", {}, ValueError, r"bad\.jsonl: the file has no rows"),
        (
            '{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": "2"}\n{"prompt": "c"}\n',
            {},
            ValueError,
            r"bad\.jsonl: row 2 has no 'answer' column \(columns: \['prompt'\]\)",
        ),
        (
            '{"prompt": "a", "answer": "1"}\n',
            {"answer_key": "anwser"},
            ValueError,
            r"bad\.jsonl: no column 'anwser'; available columns: \['answer', 'prompt'\]; did you mean 'answer'\?",
        ),
        (
            '{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": "  "}\n',
            {},
            ValueError,
            r"row 1 has an empty 'answer'",
        ),
        (
            '{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": null}\n',
            {},
            ValueError,
            r"row 1 has an empty 'answer'",
        ),
        (
            '{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": \n',
            {},
            ValueError,
            r"line 2 \(row 1\) is not valid JSON",
        ),
        (
            '{"prompt": "a", "answer": "1"}\n[1, 2]\n',
            {},
            ValueError,
            r"line 2 \(row 1\) is a list, not a JSON object",
        ),
        (
            '{"prompt": "a", "answer": "1", "id": 1}\n{"prompt": "b", "answer": "2", "id": 1}\n',
            {"uid_key": "id", "val_size": 0, "test_size": 0},
            ValueError,
            r"uid '1' appears in train and train",
        ),
    ],
)
def test_bad_files_fail_clearly_before_training(tmp_path, content, kwargs, error, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    kwargs = {"val_size": 0, "test_size": 0, **kwargs}
    with pytest.raises(error, match=match):
        JsonlTask(path=str(path), **kwargs).splits()


def test_missing_or_unsupported_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        JsonlTask(path=str(tmp_path / "nope.jsonl")).splits()
    (tmp_path / "d.csv").write_text("prompt,answer\n")
    with pytest.raises(ValueError, match="unsupported file type '.csv'"):
        JsonlTask(path=str(tmp_path / "d.csv")).splits()
    with pytest.raises(ValueError, match="data.path"):
        JsonlTask(path=None)


# --------------------------------------------------------------------------------------------- configs
def test_data_configs_instantiate(shared_data):
    paths = {
        "gsm8k": shared_data / "gsm8k" / "test.jsonl",
        "math500": shared_data / "math500" / "test.jsonl",
        "deepscaler": shared_data / "math500" / "test.jsonl",  # same columns; the hub is not reachable here
        "jsonl": shared_data / "math500" / "test.jsonl",
    }
    for name, path in paths.items():
        cfg = OmegaConf.merge({"seed": 0, "data_seed": 3}, {"data": OmegaConf.load(CONF / f"{name}.yaml")})
        cfg.data.path = str(path)
        if name == "jsonl":
            cfg.data.prompt_key = "problem"
        if name == "deepscaler":
            cfg.data.test_size = 100  # its default (500) expects the 40k-row training set
        task = instantiate(cfg.data)
        assert task.seed == 3 and task.use_chat_template == "auto"
        splits = task.splits()
        assert all(len(v) for v in splits.values()), name
        prompt = task.format_prompt(splits["val"][0], tokenizer=None)  # no tokenizer: instruction only
        if name in ("math500", "deepscaler"):
            assert prompt.endswith("put your final answer within \\boxed{}.")
        if name == "gsm8k":
            assert prompt.endswith('output the final answer after "####".')


def test_an_unreachable_hub_fails_in_seconds_naming_the_local_file_keys(monkeypatch):
    import time

    import huggingface_hub.constants as hub

    from grpolab.errors import ConfigError
    from grpolab.tasks.loading import hub_reachable, load_hub

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens there
    assert hub_reachable() is False
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"data\.hub_id='openai/gsm8k'.*data\.path \(and data\.test_path\)"):
        load_hub("openai/gsm8k", "main", "train")
    assert time.monotonic() - start < 10  # datasets alone retries for about 30 s
    assert hub.HF_HUB_OFFLINE is False  # the offline switch is put back
