"""Render Hugging Face style chat templates (jinja2) the way transformers does.

Compatibility matters more than taste here: model authors write templates
against transformers' environment, so this one matches it — a sandboxed,
immutable environment with trim_blocks/lstrip_blocks, the loop-controls
extension, `raise_exception`, `strftime_now` and a `tojson` filter that does
not escape HTML. Templates are untrusted input (they ship with checkpoints),
hence the sandbox.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The chat template failed to compile or refused the conversation."""


def _raise_exception(message: str) -> NoReturn:
    # Templates call this to reject conversations they cannot express (for
    # example an unsupported role); the message is meant for the API caller.
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # jinja2's built-in tojson HTML-escapes '<', '>' and '&', which would
    # change the prompt text; transformers replaces it with plain json.dumps.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format_string: str) -> str:
    # Llama 3 templates stamp "Today Date" with this.
    return datetime.now().strftime(format_string)


def _make_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


# Failures a template can cause while rendering: jinja's own errors plus the
# Python errors an expression like `'a' + none` or `messages[5]` raises.
_RENDER_ERRORS = (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError)


class ChatTemplate:
    """A compiled chat template; render() turns messages into prompt text."""

    __slots__ = ("_source", "_template")

    def __init__(self, source: str) -> None:
        self._source = source
        try:
            self._template = _make_environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"chat template does not compile (line {exc.lineno}): {exc.message}") from exc

    @property
    def source(self) -> str:
        return self._source

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        bos_token: str = "",
        eos_token: str = "",
        add_generation_prompt: bool = True,
        **extra_variables: Any,
    ) -> str:
        """Render the conversation; extra_variables (e.g. tools) pass through."""
        try:
            return self._template.render(
                messages=[dict(message) for message in messages],  # non-mappings fail here too
                bos_token=bos_token,
                eos_token=eos_token,
                add_generation_prompt=add_generation_prompt,
                **extra_variables,
            )
        except ChatTemplateError:
            raise
        except _RENDER_ERRORS as exc:
            raise ChatTemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") from exc


def select_template_source(chat_template: str | Sequence[Mapping[str, str]] | None, name: str = "default") -> str | None:
    """Pick a template from tokenizer_config.json's `chat_template` field.

    The field is either a string or a list of {"name", "template"} entries
    (models that also ship e.g. a "tool_use" template); None when absent.
    """
    if chat_template is None or isinstance(chat_template, str):
        return chat_template
    by_name: dict[str, str] = {}
    for entry in chat_template:
        if not isinstance(entry, Mapping) or "name" not in entry or "template" not in entry:
            raise ChatTemplateError(f"chat_template list entries need 'name' and 'template' keys, got {entry!r}")
        by_name[entry["name"]] = entry["template"]
    if name not in by_name:
        raise ChatTemplateError(f"no chat template named {name!r}; available: {sorted(by_name)}")
    return by_name[name]
