"""Fixtures shared across the whole test tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny Llama checkpoint (HF format), built once and reused across runs.

    Lives in .sluice/models/tiny-llama (git-ignored); SLUICE_TINY_MODEL_DIR
    points elsewhere. Building takes a few seconds and is deterministic, so a
    cached copy is as good as a fresh one; delete the directory to rebuild
    after changing sluice.tinymodel.
    """
    override = os.environ.get("SLUICE_TINY_MODEL_DIR")
    model_dir = Path(override) if override else REPO_ROOT / ".sluice" / "models" / "tiny-llama"
    if not (model_dir / "config.json").exists():
        # Imported here so torch-free test runs never load torch via conftest.
        from sluice.tinymodel import build_tiny_checkpoint

        build_tiny_checkpoint(model_dir)
    return model_dir


@pytest.fixture(scope="session")
def small_model_dir(tiny_model_dir: Path) -> Path:
    """A 2-layer model with the tiny one's tokenizer (what `make model`
    builds beside it): the fallback and routed-to version in tests."""
    model_dir = tiny_model_dir.parent / "tiny-llama-small"
    if not (model_dir / "config.json").exists():
        from sluice.tinymodel import build_tiny_checkpoint

        build_tiny_checkpoint(model_dir, seed=1, num_layers=2)
    return model_dir


@pytest.fixture(scope="session")
def postgres_session_url():
    """SQLAlchemy URL of a Postgres database created for this test session."""
    from support.postgres import throwaway_database

    yield from throwaway_database()
