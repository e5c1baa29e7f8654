"""A model version's tokenizer and chat template, loaded from its HF files.

Reads what a Hugging Face checkpoint directory carries:

    tokenizer.json          the fast tokenizer itself (required)
    tokenizer_config.json   bos/eos tokens, chat_template, model_max_length
    chat_template.jinja     the template, where newer transformers save it
    generation_config.json  eos_token_id (int or list), when present

No torch or transformers: the router, which is torch-free, uses this.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers

from sluice.tokenization.chat_template import ChatTemplate, ChatTemplateError, select_template_source

# transformers writes this sentinel as model_max_length when a tokenizer
# config gives none (int(1e30)); treat anything that large as "unknown".
_UNSET_MODEL_MAX_LENGTH = 10**18


# From this many characters (~500 tokens) a text is encoded without the GIL;
# below it the single call's ~0.1 ms costs less than the batch call's setup.
GIL_FREE_ENCODE_MIN_CHARS = 2048


class Tokenizer:
    """Text <-> token ids for one model version. Immutable after construction."""

    __slots__ = (
        "_backend", "_bos_token", "_eos_token", "_bos_token_id", "_eos_token_ids",
        "_chat_template", "_model_max_length",
    )

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        extra_eos_token_ids: Sequence[int] = (),
        chat_template: str | None = None,
        model_max_length: int | None = None,
    ) -> None:
        self._backend = backend
        self._bos_token = bos_token
        self._eos_token = eos_token
        self._bos_token_id = self._token_id(bos_token) if bos_token is not None else None
        eos_ids = set(extra_eos_token_ids)
        if eos_token is not None:
            eos_ids.add(self._token_id(eos_token))
        self._eos_token_ids = frozenset(eos_ids)
        self._chat_template = ChatTemplate(chat_template) if chat_template is not None else None
        self._model_max_length = model_max_length

    @classmethod
    def from_pretrained(cls, model_dir: Path) -> Tokenizer:
        """Load from a HF checkpoint directory (see the module docstring)."""
        model_dir = Path(model_dir)
        tokenizer_path = model_dir / "tokenizer.json"
        if not tokenizer_path.is_file():
            raise FileNotFoundError(f"{tokenizer_path} not found: only fast (tokenizer.json) tokenizers are supported")
        backend = tokenizers.Tokenizer.from_file(str(tokenizer_path))
        config = _read_json_object(model_dir / "tokenizer_config.json")
        generation_config = _read_json_object(model_dir / "generation_config.json")

        max_length = config.get("model_max_length")
        if not isinstance(max_length, int) or max_length >= _UNSET_MODEL_MAX_LENGTH:
            max_length = None
        return cls(
            backend,
            bos_token=_token_content(config.get("bos_token"), "bos_token"),
            eos_token=_token_content(config.get("eos_token"), "eos_token"),
            extra_eos_token_ids=_id_list(generation_config.get("eos_token_id"), "generation_config eos_token_id"),
            chat_template=_chat_template_source(model_dir, config),
            model_max_length=max_length,
        )

    @property
    def bos_token_id(self) -> int | None:
        return self._bos_token_id

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every id that ends generation: the tokenizer's eos plus generation_config's."""
        return self._eos_token_ids

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer can produce, added tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def model_max_length(self) -> int | None:
        """tokenizer_config's model_max_length, or None when unset."""
        return self._model_max_length

    @property
    def has_chat_template(self) -> bool:
        return self._chat_template is not None

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids for text. Special tokens written in the text map to their ids;
        add_special_tokens adds the post-processor's (e.g. a leading bos).

        A long text goes through the batch call, which releases the GIL while
        Rust works (the single call holds it throughout: ~4 ms for 1,500
        tokens, during which the router's event loop and every other
        tenant's tokenization stood still); the ids are the same."""
        if len(text) >= GIL_FREE_ENCODE_MIN_CHARS:
            return self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **template_variables: Any,
    ) -> str:
        """The prompt text for a conversation; raises ChatTemplateError."""
        if self._chat_template is None:
            raise ChatTemplateError("this model has no chat template; send a plain prompt instead")
        return self._chat_template.render(
            messages,
            bos_token=self._bos_token or "",
            eos_token=self._eos_token or "",
            add_generation_prompt=add_generation_prompt,
            **template_variables,
        )

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **template_variables: Any,
    ) -> list[int]:
        """Prompt token ids for a conversation.

        The template already writes bos and the role markers, so the text is
        encoded without adding special tokens (a second bos would shift the
        model off its training distribution).
        """
        text = self.render_chat(messages, add_generation_prompt, **template_variables)
        return self.encode(text, add_special_tokens=False)

    def _token_id(self, token: str) -> int:
        token_id = self._backend.token_to_id(token)
        if token_id is None:
            raise ValueError(f"special token {token!r} is not in the tokenizer's vocabulary")
        return token_id


def _read_json_object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(document).__name__}")
    return document


def _chat_template_source(model_dir: Path, config: Mapping[str, Any]) -> str | None:
    # Recent transformers versions write the template to its own file, not
    # into tokenizer_config.json; an inline one wins when both exist, as there.
    inline = select_template_source(config.get("chat_template"))
    if inline is not None:
        return inline
    template_path = model_dir / "chat_template.jinja"
    return template_path.read_text(encoding="utf-8") if template_path.is_file() else None


def _token_content(value: Any, field: str) -> str | None:
    # HF writes special tokens either as a plain string or as a serialized
    # AddedToken: {"content": "<s>", "lstrip": false, ...}.
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise ValueError(f"tokenizer_config {field} must be a string or {{'content': ...}}, got {value!r}")


def _id_list(value: Any, field: str) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    raise ValueError(f"{field} must be an int or a list of ints, got {value!r}")
