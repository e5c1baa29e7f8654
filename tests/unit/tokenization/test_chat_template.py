"""Chat template rendering: the tiny model's template and HF-compatible semantics."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.tokenization import ChatTemplate, ChatTemplateError, Tokenizer
from sluice.tokenization.chat_template import select_template_source

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Bye?"},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(tiny_model_dir)


def test_tiny_template_renders_llama_style_turns(tokenizer: Tokenizer) -> None:
    assert tokenizer.render_chat(CONVERSATION) == (
        "<s><|system|>\nBe brief.</s>\n"
        "<|user|>\nHi!</s>\n"
        "<|assistant|>\nHello.</s>\n"
        "<|user|>\nBye?</s>\n"
        "<|assistant|>\n"
    )


def test_generation_prompt_is_optional(tokenizer: Tokenizer) -> None:
    text = tokenizer.render_chat(CONVERSATION[:2], add_generation_prompt=False)
    assert text == "<s><|system|>\nBe brief.</s>\n<|user|>\nHi!</s>\n"


def test_tiny_template_accepts_text_parts_and_null_content(tokenizer: Tokenizer) -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None},
    ]
    assert tokenizer.render_chat(messages, add_generation_prompt=False) == "<s><|user|>\nab</s>\n<|assistant|>\n</s>\n"


def test_tiny_template_rejects_unknown_roles_with_a_clear_error(tokenizer: Tokenizer) -> None:
    with pytest.raises(ChatTemplateError, match="unsupported role: tool"):
        tokenizer.render_chat([{"role": "tool", "content": "42"}])


def test_blocks_are_trimmed_like_transformers() -> None:
    template = ChatTemplate("{% for m in messages %}\n    {{ m.content }}\n{% endfor %}")
    assert template.render([{"content": "a"}, {"content": "b"}]) == "    a\n    b\n"
    # lstrip_blocks drops the indentation before a block tag; trim_blocks
    # the newline after one.
    indented = ChatTemplate("{% for m in messages %}\n  {% if m.content %}{{ m.content }}{% endif %}\n{% endfor %}")
    assert indented.render([{"content": "x"}]) == "x"


def test_tojson_does_not_html_escape() -> None:
    template = ChatTemplate("{{ tools | tojson }}")
    assert template.render([], tools=[{"name": "<a&b>", "text": "é"}]) == '[{"name": "<a&b>", "text": "é"}]'


def test_variables_and_loop_controls_are_available() -> None:
    template = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{{ m['role'] }}{% endfor %}{% if add_generation_prompt %}+{% endif %}{{ eos_token }}"
    )
    rendered = template.render(CONVERSATION, bos_token="<B>", eos_token="<E>", add_generation_prompt=True)
    assert rendered == "<B>system+<E>"


def test_syntax_errors_surface_at_construction() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")


def test_render_errors_become_chat_template_errors() -> None:
    with pytest.raises(ChatTemplateError, match="failed to render"):
        ChatTemplate("{{ messages[0]['content'] + 1 }}").render([{"content": "a"}])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages[0]['content'] }}").render(["not a mapping"])


def test_templates_are_sandboxed() -> None:
    # ImmutableSandboxedEnvironment refuses to mutate passed-in data.
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages.append(1) }}").render([])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render([])


def test_raise_exception_message_reaches_the_caller() -> None:
    template = ChatTemplate("{{ raise_exception('system message must come first') }}")
    with pytest.raises(ChatTemplateError, match="^system message must come first$"):
        template.render([])


def test_named_templates_pick_default() -> None:
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    assert select_template_source(named) == "D"
    assert select_template_source(named, "tool_use") == "T"
    assert select_template_source("S") == "S"
    assert select_template_source(None) is None
    with pytest.raises(ChatTemplateError, match="no chat template named 'default'"):
        select_template_source([{"name": "tool_use", "template": "T"}])
    with pytest.raises(ChatTemplateError, match="'name' and 'template'"):
        select_template_source([{"template": "T"}])
