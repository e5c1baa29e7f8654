"""Builds the deterministic tiny Llama checkpoint used by tests and local runs."""

from sluice.tinymodel.build import build_tiny_checkpoint

__all__ = ["build_tiny_checkpoint"]
