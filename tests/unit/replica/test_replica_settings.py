"""Replica knobs whose defaults depend on the hardware."""

from sluice.replica.settings import (
    CPU_BATCH_PREFILL_TOKENS_BESIDE_INTERACTIVE, CPU_LONG_PREFILL_CHUNK_TOKENS, CUDA_BATCH_PREFILL_TOKENS_BESIDE_INTERACTIVE,
    CUDA_LONG_PREFILL_CHUNK_TOKENS, ReplicaSettings,
)


def test_the_long_prefill_chunk_defaults_by_device_and_a_set_value_wins(monkeypatch):
    monkeypatch.delenv("SLUICE_LONG_PREFILL_CHUNK_TOKENS", raising=False)
    assert ReplicaSettings(device="cpu").long_prefill_chunk_for_device() == CPU_LONG_PREFILL_CHUNK_TOKENS
    assert ReplicaSettings(device="cuda:1").long_prefill_chunk_for_device() == CUDA_LONG_PREFILL_CHUNK_TOKENS
    monkeypatch.setenv("SLUICE_LONG_PREFILL_CHUNK_TOKENS", "0")
    assert ReplicaSettings(device="cuda").long_prefill_chunk_for_device() == 0  # 0 = no cap, not "unset"


def test_the_depth_scale_is_the_models_unless_set(monkeypatch):
    monkeypatch.delenv("SLUICE_PREFILL_DEPTH_SCALE_TOKENS", raising=False)
    assert ReplicaSettings().prefill_depth_scale_tokens is None
    monkeypatch.setenv("SLUICE_PREFILL_DEPTH_SCALE_TOKENS", "none")
    assert ReplicaSettings().prefill_depth_scale_tokens is None
    monkeypatch.setenv("SLUICE_PREFILL_DEPTH_SCALE_TOKENS", "0")
    assert ReplicaSettings().prefill_depth_scale_tokens == 0


def test_the_batch_cap_beside_interactive_defaults_by_device_and_a_set_value_wins(monkeypatch):
    monkeypatch.delenv("SLUICE_BATCH_PREFILL_TOKENS_BESIDE_INTERACTIVE", raising=False)
    cpu, cuda = ReplicaSettings(device="cpu"), ReplicaSettings(device="cuda")
    assert cpu.batch_prefill_beside_interactive_for_device() == CPU_BATCH_PREFILL_TOKENS_BESIDE_INTERACTIVE
    assert cuda.batch_prefill_beside_interactive_for_device() == CUDA_BATCH_PREFILL_TOKENS_BESIDE_INTERACTIVE
    monkeypatch.setenv("SLUICE_BATCH_PREFILL_TOKENS_BESIDE_INTERACTIVE", "0")
    assert ReplicaSettings(device="cpu").batch_prefill_beside_interactive_for_device() == 0
