"""sluice.tokenization agrees with transformers (a test-only dependency) on the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.tokenization import Tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = [
    "hello world",
    "def f(x):\n    return x * 2\n",
    "  spaces  and\ttabs\n",
    "中文 😀 naïve",
    "<s>inline special</s> tokens <|user|>",
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there!"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What's 2+2? 🤔"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "中文?"},
    ],
]


@pytest.fixture(scope="module")
def ours(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def theirs(tiny_model_dir: Path):
    return transformers.AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.mark.parametrize("text", TEXTS)
def test_encode_and_decode_match_transformers(ours: Tokenizer, theirs, text: str) -> None:
    assert ours.encode(text) == theirs.encode(text, add_special_tokens=False)
    assert ours.encode(text, add_special_tokens=True) == theirs.encode(text, add_special_tokens=True)
    ids = ours.encode(text)
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert ours.decode(ids, skip_special_tokens=False) == theirs.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(ours: Tokenizer, theirs, messages, add_generation_prompt: bool) -> None:
    text = theirs.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    assert ours.render_chat(messages, add_generation_prompt=add_generation_prompt) == text
    encoded = theirs.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    # transformers 5 returns a BatchEncoding here; 4.x returned a plain list.
    their_ids = list(encoded["input_ids"]) if hasattr(encoded, "keys") else list(encoded)
    assert ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == their_ids


def test_special_ids_match_transformers(ours: Tokenizer, theirs) -> None:
    assert ours.bos_token_id == theirs.bos_token_id
    assert ours.eos_token_ids == {theirs.eos_token_id}
    assert ours.vocab_size == len(theirs)
