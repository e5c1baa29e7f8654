"""IncrementalDetokenizer: streamed text equals the full decode, never a broken character."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.tokenization import IncrementalDetokenizer, Tokenizer

MULTI_BYTE = "naïve 中文分词 😀🎉 👩‍👩‍👧 🇳🇱 done. 日本語"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(tiny_model_dir)


def _stream(detokenizer: IncrementalDetokenizer, chunks: Sequence[Sequence[int]]) -> list[str]:
    pieces = [detokenizer.push(list(chunk)) for chunk in chunks]
    pieces.append(detokenizer.flush())
    return pieces


def test_token_by_token_equals_full_decode_without_broken_characters(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(MULTI_BYTE)
    # The byte-level tokenizer splits these characters over several tokens,
    # so this exercises the hold-back path.
    assert len(ids) > len(MULTI_BYTE.split())
    pieces = _stream(IncrementalDetokenizer(tokenizer), [[i] for i in ids])
    assert "".join(pieces) == MULTI_BYTE
    assert not any("\ufffd" in piece for piece in pieces)
    assert "" in pieces, "some tokens were partial characters and held back"


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=60), data=st.data())
def test_random_chunking_reproduces_the_text(tokenizer: Tokenizer, text: str, data: st.DataObject) -> None:
    ids = tokenizer.encode(text)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(ids)), max_size=8)))
    bounds = [0, *cuts, len(ids)]
    chunks = [ids[a:b] for a, b in zip(bounds, bounds[1:])]
    pieces = _stream(IncrementalDetokenizer(tokenizer, skip_special_tokens=False), chunks)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=False)
    if "\ufffd" not in text:
        assert not any("\ufffd" in piece for piece in pieces)


def test_special_tokens_are_skipped_mid_stream(tokenizer: Tokenizer) -> None:
    ids = [*tokenizer.encode("hello"), 2, *tokenizer.encode(" world 😀")]
    pieces = _stream(IncrementalDetokenizer(tokenizer), [[i] for i in ids])
    assert "".join(pieces) == "hello world 😀"
    kept = _stream(IncrementalDetokenizer(tokenizer, skip_special_tokens=False), [[i] for i in ids])
    assert "".join(kept) == "hello</s> world 😀"


def test_flush_releases_a_truncated_character(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("ok 😀")
    detokenizer = IncrementalDetokenizer(tokenizer)
    streamed = "".join(detokenizer.push([i]) for i in ids[:-1])
    assert "\ufffd" not in streamed
    assert detokenizer.flush().endswith("\ufffd"), "a stream cut mid-emoji shows the damage only at the end"
    assert detokenizer.flush() == ""


def test_context_ids_are_never_emitted(tokenizer: Tokenizer) -> None:
    prompt = tokenizer.encode("prompt text")
    detokenizer = IncrementalDetokenizer(tokenizer, context_token_ids=prompt[-3:])
    assert "".join(_stream(detokenizer, [[i] for i in tokenizer.encode(" reply")])) == " reply"


class _DecodeSpy:
    """Wraps a Tokenizer and records how many ids each decode saw."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self.decoded_lengths: list[int] = []

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        self.decoded_lengths.append(len(ids))
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def test_decode_cost_stays_bounded_by_the_window(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("word " * 400 + MULTI_BYTE * 5)
    spy = _DecodeSpy(tokenizer)
    detokenizer = IncrementalDetokenizer(spy)  # type: ignore[arg-type]
    text = "".join(_stream(detokenizer, [[i] for i in ids]))
    assert text == tokenizer.decode(ids)
    # The longest decode covers one emitted token plus one held-back
    # character (at most 4 byte tokens), never the whole output.
    assert max(spy.decoded_lengths) <= 8
