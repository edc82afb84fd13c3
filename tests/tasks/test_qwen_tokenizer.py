"""The Qwen2.5 tokenizer from ../shared/data/qwen2.5-tokenizer: ids and chat template as documented in
SOURCES.md, and the prompts our tasks build with it."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from grpolab.tasks.gsm8k import GSM8KTask
from grpolab.tasks.math import MathTask

QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
JANET = "Janet’s ducks lay 16 eggs per day."


@pytest.fixture(scope="module")
def tokenizer(shared_data):
    return AutoTokenizer.from_pretrained(str(shared_data / "qwen2.5-tokenizer"))


def test_ids_length_and_eos(tokenizer):
    assert tokenizer.encode(JANET) == [18315, 295, 748, 77778, 10962, 220, 16, 21, 18805, 817, 1899, 13]
    assert len(tokenizer) == 151665
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 151645
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") == 151644


def test_gsm8k_prompt_uses_the_qwen_chat_template(tokenizer, shared_data):
    task = GSM8KTask(path=str(shared_data / "gsm8k" / "test.jsonl"), val_size=0, test_size=1)
    row = {"uid": "u", "prompt": JANET, "answer": "18"}
    assert task.format_prompt(row, tokenizer) == (
        f"<|im_start|>system\n{QWEN_SYSTEM}<|im_end|>\n"
        f'<|im_start|>user\n{JANET}\nLet\'s think step by step and output the final answer after "####".<|im_end|>\n'
        "<|im_start|>assistant\n"
    )


def test_math_prompt_with_system_prompt_and_without_template(tokenizer):
    row = {"uid": "u", "prompt": "What is $1+1$?", "answer": "2"}
    task = MathTask(path="unused.jsonl", system_prompt="Be brief.")
    assert task.format_prompt(row, tokenizer) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is $1+1$?\nPlease reason step by step, and put your final answer within \\boxed{}.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    plain = MathTask(path="unused.jsonl", use_chat_template=False)
    assert plain.format_prompt(row, tokenizer) == (
        "What is $1+1$?\nPlease reason step by step, and put your final answer within \\boxed{}."
    )
    ids = tokenizer(task.format_prompt(row, tokenizer))["input_ids"]
    assert ids[0] == 151644 and ids[-3:] == [151644, 77091, 198]  # <|im_start|> assistant \n
