"""The quality runner on real checkpoints with the project's model code, on
CPU: the tiny Llama against itself, and against the 2-layer one (other
random weights, the same tokenizer). A reduced prompt set keeps it fast."""

import dataclasses
import json
import shutil

import pytest

from sluice.rollout.quality.prompts import default_prompt_set
from sluice.rollout.quality.runner import run_quality_check
from sluice.rollout.quality.score import QualityThresholds


@pytest.fixture(scope="module")
def prompt_set():
    full = default_prompt_set()
    return dataclasses.replace(full, prompts=full.prompts[:4], max_new_tokens=8)


def test_the_same_weights_twice_pass_with_full_agreement(tiny_model_dir, prompt_set):
    report = run_quality_check(tiny_model_dir, tiny_model_dir, prompt_set, QualityThresholds())
    assert report.passed, report.summary()
    assert report.greedy_agreement == 1.0
    assert abs(report.logprob_drop) < 1e-5
    assert report.regressions == ()


def test_other_weights_fail_greedy_agreement(tiny_model_dir, small_model_dir, prompt_set):
    report = run_quality_check(tiny_model_dir, small_model_dir, prompt_set, QualityThresholds())
    assert not report.passed
    assert report.greedy_agreement < 0.5
    assert any("greedy agreement" in failure for failure in report.failures)


def test_a_different_tokenizer_is_an_error_not_a_score(tiny_model_dir, tmp_path, prompt_set):
    # The tokenizer files only: the mismatch is found before any weights load.
    other = tmp_path / "other-tokenizer"
    shutil.copytree(tiny_model_dir, other, ignore=shutil.ignore_patterns("*.safetensors", "chat_template*"))
    # Without its chat template the same conversation encodes to other prompt ids.
    document = json.loads((other / "tokenizer_config.json").read_text())
    document.pop("chat_template", None)
    (other / "tokenizer_config.json").write_text(json.dumps(document))
    with pytest.raises(ValueError, match="tokenize the prompt set differently"):
        run_quality_check(tiny_model_dir, other, prompt_set, QualityThresholds())
