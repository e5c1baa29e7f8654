"""The tiny checkpoint loads in transformers and behaves usefully.

transformers is a test-only dependency: it is the reference for "a real HF
checkpoint", not something Sluice imports at run time.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

PROMPTS = [
    "def foo(x):\n    return x + 1\n",
    "The quick brown fox jumps over the lazy dog.",
    "import os\nimport sys\n",
    "class Config:\n    pass\n",
    "Hello, 世界! 😀",
]


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir: Path):
    model = transformers.LlamaForCausalLM.from_pretrained(str(tiny_model_dir))
    return model.eval()


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_dir: Path):
    return transformers.AutoTokenizer.from_pretrained(str(tiny_model_dir))


def test_forward_gives_logits_over_the_vocabulary(hf_model, hf_tokenizer) -> None:
    input_ids = torch.tensor([hf_tokenizer(PROMPTS[0]).input_ids])  # [1, seq]
    with torch.no_grad():
        logits = hf_model(input_ids).logits  # [1, seq, vocab]
    assert logits.shape == (1, input_ids.shape[1], 32000)
    assert logits.dtype == torch.float32
    assert bool(torch.isfinite(logits).all())


def test_greedy_choice_is_clearly_separated(hf_model, hf_tokenizer) -> None:
    # A random-init model has near-uniform logits; tests that compare greedy
    # decodes across implementations need the top-1/top-2 gap to sit well
    # above float noise (~1e-5) at nearly every position.
    gaps = []
    with torch.no_grad():
        for prompt in PROMPTS:
            logits = hf_model(torch.tensor([hf_tokenizer(prompt).input_ids])).logits[0]  # [seq, vocab]
            top2 = logits.topk(2, dim=-1).values  # [seq, 2]
            gaps.extend((top2[:, 0] - top2[:, 1]).tolist())
    gaps.sort()
    assert gaps[len(gaps) // 2] > 1e-2, f"median gap {gaps[len(gaps) // 2]}"
    assert sum(gap > 1e-3 for gap in gaps) >= 0.9 * len(gaps)


def test_transformers_tokenizer_has_our_special_tokens(hf_tokenizer) -> None:
    assert (hf_tokenizer.bos_token_id, hf_tokenizer.eos_token_id, hf_tokenizer.pad_token_id) == (1, 2, 3)
    assert hf_tokenizer.unk_token == "<unk>"
    assert hf_tokenizer("hi").input_ids[0] == 1, "encode with special tokens prepends <s>"
