"""sluice.tokenization.Tokenizer: loading HF files, encode/decode, chat prompts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.tokenization import ChatTemplateError, Tokenizer
from sluice.tokenization.tokenizer import GIL_FREE_ENCODE_MIN_CHARS

SAMPLES = [
    "",
    "hello world",
    "def f(x):\n    return {'a': [1, 2.5]}\n",
    "  leading and trailing spaces  ",
    "tabs\tand\r\nnewlines\n\n",
    "héllo wörld — naïve café",
    "中文分词测试，日本語のテキスト、한국어",
    "emoji 😀🎉👩‍👩‍👧 flags 🇳🇱",
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(tiny_model_dir)


def test_properties_come_from_the_config_files(tokenizer: Tokenizer) -> None:
    assert tokenizer.bos_token_id == 1
    assert tokenizer.eos_token_ids == frozenset({2})
    assert tokenizer.vocab_size == 32000
    assert tokenizer.model_max_length == 4096
    assert tokenizer.has_chat_template
    assert tokenizer.token_to_id("<|assistant|>") == 6


@pytest.mark.parametrize("text", SAMPLES)
def test_encode_decode_round_trips(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    assert all(0 <= i < tokenizer.vocab_size for i in ids)
    assert tokenizer.decode(ids) == text


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=80))
def test_any_text_round_trips(tokenizer: Tokenizer, text: str) -> None:
    # Keep special tokens in the decode: text may spell one, e.g. "<s>".
    assert tokenizer.decode(tokenizer.encode(text), skip_special_tokens=False) == text


def test_special_tokens_in_text_map_to_their_ids(tokenizer: Tokenizer) -> None:
    assert tokenizer.encode("<s><|user|>\nhi</s>")[:2] == [1, 5]
    assert tokenizer.encode("hi</s>")[-1] == 2
    assert tokenizer.decode(tokenizer.encode("<s>hi</s>")) == "hi"
    assert tokenizer.decode(tokenizer.encode("<s>hi</s>"), skip_special_tokens=False) == "<s>hi</s>"


def test_add_special_tokens_prepends_bos(tokenizer: Tokenizer) -> None:
    assert tokenizer.encode("hi", add_special_tokens=True) == [1, *tokenizer.encode("hi")]


@pytest.mark.parametrize("add_special_tokens", [False, True])
def test_a_long_text_encodes_as_the_single_call_does(tokenizer: Tokenizer, add_special_tokens: bool) -> None:
    # Long texts take the batch call (it releases the GIL); the ids must not change.
    text = " ".join(SAMPLES) * (GIL_FREE_ENCODE_MIN_CHARS // len(" ".join(SAMPLES)) + 2) + "<s>end</s>"
    assert len(text) >= GIL_FREE_ENCODE_MIN_CHARS
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    assert ids == tokenizer._backend.encode(text, add_special_tokens=add_special_tokens).ids  # the single call
    assert tokenizer.decode(ids, skip_special_tokens=False).endswith("<s>end</s>")


def test_apply_chat_template_encodes_the_rendered_prompt(tokenizer: Tokenizer) -> None:
    messages = [{"role": "user", "content": "What is 2+2? 🤔"}]
    ids = tokenizer.apply_chat_template(messages)
    assert ids == tokenizer.encode(tokenizer.render_chat(messages))
    assert ids[:3] == [1, 5, tokenizer.encode("\n")[0]], "one bos, then the user marker"
    assert ids.count(1) == 1
    assert ids[-2:] == [6, tokenizer.encode("\n")[0]]


def _copy_tokenizer_files(src: Path, dst: Path, **config_overrides: object) -> Path:
    dst.mkdir()
    shutil.copy(src / "tokenizer.json", dst / "tokenizer.json")
    config = json.loads((src / "tokenizer_config.json").read_text())
    config.update(config_overrides)
    (dst / "tokenizer_config.json").write_text(json.dumps(config))
    return dst


def test_loads_added_token_dicts_named_templates_and_eos_lists(tiny_model_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy_tokenizer_files(
        tiny_model_dir,
        tmp_path / "variant",
        bos_token={"content": "<s>", "lstrip": False, "normalized": False},
        eos_token={"content": "</s>"},
        chat_template=[{"name": "default", "template": "{{ bos_token }}D"}, {"name": "tool_use", "template": "T"}],
        model_max_length=int(1e30),
    )
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 3]}))
    tokenizer = Tokenizer.from_pretrained(model_dir)
    assert tokenizer.bos_token_id == 1
    assert tokenizer.eos_token_ids == frozenset({2, 3})
    assert tokenizer.model_max_length is None
    assert tokenizer.render_chat([]) == "<s>D"


def test_missing_chat_template_is_a_clear_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy_tokenizer_files(tiny_model_dir, tmp_path / "plain", chat_template=None)
    tokenizer = Tokenizer.from_pretrained(model_dir)
    assert not tokenizer.has_chat_template
    with pytest.raises(ChatTemplateError, match="no chat template"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])


def test_template_may_live_in_chat_template_jinja(tiny_model_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy_tokenizer_files(tiny_model_dir, tmp_path / "jinja", chat_template=None)
    (model_dir / "chat_template.jinja").write_text("{{ bos_token }}{{ messages[0]['content'] }}")
    assert Tokenizer.from_pretrained(model_dir).render_chat([{"role": "user", "content": "x"}]) == "<s>x"


def test_bad_files_are_clear_errors(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_pretrained(tmp_path)
    unknown_bos = _copy_tokenizer_files(tiny_model_dir, tmp_path / "bos", bos_token="<never>")
    with pytest.raises(ValueError, match="'<never>' is not in the tokenizer's vocabulary"):
        Tokenizer.from_pretrained(unknown_bos)
    bad_eos = _copy_tokenizer_files(tiny_model_dir, tmp_path / "eos")
    (bad_eos / "generation_config.json").write_text(json.dumps({"eos_token_id": "2"}))
    with pytest.raises(ValueError, match="eos_token_id must be an int or a list of ints"):
        Tokenizer.from_pretrained(bad_eos)


def test_the_package_does_not_import_torch_or_transformers() -> None:
    # The router image ships without torch; importing must not pull it in.
    code = (
        "import sys, sluice.tokenization\n"
        "heavy = {'torch', 'transformers'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
