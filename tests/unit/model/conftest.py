"""Small factories shared by the model tests: tiny configs and HF checkpoints."""

from __future__ import annotations

import pytest

from support.tiny_llama import LLAMA3_ROPE, save_tiny_hf_model, tiny_config, tiny_hf_dict


# Tests get the factories through fixtures rather than `from conftest import`,
# which breaks under pytest's importlib mode and with several conftest.py files.
@pytest.fixture
def make_hf_dict():
    return tiny_hf_dict


@pytest.fixture
def make_config():
    return tiny_config


@pytest.fixture
def make_hf_checkpoint():
    return save_tiny_hf_model


@pytest.fixture
def llama3_rope():
    return dict(LLAMA3_ROPE)
