"""Train the tiny model's byte-level BPE tokenizer offline.

The corpus is the Python standard library's own sources, which every machine
that runs this code already has, so the build needs no network and no data
download. The training is deterministic for a given stdlib: files are read in
sorted order, and the `tokenizers` BPE trainer breaks count ties by pair order.

This module does not import torch, so it can also build tokenizer-only
fixtures for torch-free tests.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

UNK_TOKEN = "<unk>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
PAD_TOKEN = "<pad>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
# Order fixes the ids: <unk>=0, <s>=1, </s>=2, <pad>=3, roles 4..6.
SPECIAL_TOKENS = (UNK_TOKEN, BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, *ROLE_TOKENS)

# The stdlib minus tests is ~11 MiB on CPython 3.11; ~8 MiB is the least that
# yields the full 32000-entry vocabulary, so 10 MiB leaves margin while
# keeping training at a few seconds on two cores.
DEFAULT_CORPUS_CAP_BYTES = 10 * 1024 * 1024
_EXCLUDED_DIR_NAMES = frozenset({"test", "tests", "idle_test", "site-packages", "__pycache__"})

MODEL_MAX_LENGTH_TOKENS = 4096

# Llama-ish: bos, then per message "<|role|>\n" + content + eos + "\n", then
# "<|assistant|>\n" to prompt a reply. Content may be a string, None (an
# assistant turn that only called tools), or a list of {"type": "text"} parts.
CHAT_TEMPLATE = (
    "{{- bos_token -}}\n"
    "{%- for message in messages -%}\n"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}\n"
    "{{- raise_exception('unsupported role: ' ~ message['role']) -}}\n"
    "{%- endif -%}\n"
    "{%- set content = message['content'] -%}\n"
    "{%- if content is none -%}{%- set content = '' -%}\n"
    "{%- elif content is not string -%}\n"
    "{%- set ns = namespace(text='') -%}\n"
    "{%- for part in content -%}\n"
    "{%- if part['type'] != 'text' -%}"
    "{{- raise_exception('unsupported content part: ' ~ part['type']) -}}"
    "{%- endif -%}\n"
    "{%- set ns.text = ns.text ~ part['text'] -%}\n"
    "{%- endfor -%}\n"
    "{%- set content = ns.text -%}\n"
    "{%- endif -%}\n"
    "{{- '<|' ~ message['role'] ~ '|>\\n' ~ content ~ eos_token ~ '\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}\n"
)


@dataclass(slots=True, frozen=True)
class TokenizerFiles:
    """The JSON documents that make up a Hugging Face fast tokenizer."""

    tokenizer_json: str
    tokenizer_config: dict[str, object]
    special_tokens_map: dict[str, object]


def stdlib_corpus(cap_bytes: int = DEFAULT_CORPUS_CAP_BYTES) -> list[str]:
    """Return stdlib *.py sources in sorted path order, stopping after cap_bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(
        (p for p in root.rglob("*.py") if not _EXCLUDED_DIR_NAMES.intersection(p.relative_to(root).parts[:-1])),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    texts: list[str] = []
    total_bytes = 0
    for path in paths:
        if total_bytes >= cap_bytes:
            break
        raw = path.read_bytes()
        # A few stdlib files are deliberately not UTF-8; replacement keeps the
        # corpus deterministic without skipping them.
        texts.append(raw.decode("utf-8", errors="replace"))
        total_bytes += len(raw)
    return texts


def train_tokenizer(vocab_size: int, corpus: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 byte symbols up front, so any input text is encodable.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    if tokenizer.get_vocab_size() != vocab_size:
        raise RuntimeError(
            f"the tokenizer corpus yielded {tokenizer.get_vocab_size()} tokens, not {vocab_size}; "
            "raise the corpus cap (this Python's stdlib may be smaller than expected)"
        )
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    # Like Llama: encode(..., add_special_tokens=True) prepends <s>.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return tokenizer


def tokenizer_files(tokenizer: Tokenizer) -> TokenizerFiles:
    added_tokens_decoder = {
        str(tokenizer.token_to_id(token)): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in SPECIAL_TOKENS
    }
    special_tokens_map: dict[str, object] = {
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "unk_token": UNK_TOKEN,
        "pad_token": PAD_TOKEN,
        "additional_special_tokens": list(ROLE_TOKENS),
    }
    tokenizer_config: dict[str, object] = {
        **special_tokens_map,
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": added_tokens_decoder,
        "chat_template": CHAT_TEMPLATE,
        # Decoding must be a pure byte-level inverse so that transformers and
        # sluice.tokenization agree on every string.
        "clean_up_tokenization_spaces": False,
        "model_max_length": MODEL_MAX_LENGTH_TOKENS,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    return TokenizerFiles(
        tokenizer_json=tokenizer.to_str(pretty=True),
        tokenizer_config=tokenizer_config,
        special_tokens_map=special_tokens_map,
    )
