"""Replica knobs whose defaults depend on the hardware."""

import pytest

from sluice.replica.settings import DEVICE_DEFAULTS, ReplicaSettings


@pytest.mark.parametrize("name", sorted(DEVICE_DEFAULTS))
def test_device_knobs_default_by_device_and_a_set_value_wins(monkeypatch, name):
    monkeypatch.delenv(f"SLUICE_{name.upper()}", raising=False)
    assert ReplicaSettings(device="cpu").for_device(name) == DEVICE_DEFAULTS[name].cpu
    assert ReplicaSettings(device="cuda:1").for_device(name) == DEVICE_DEFAULTS[name].cuda
    monkeypatch.setenv(f"SLUICE_{name.upper()}", "0")
    assert ReplicaSettings(device="cuda").for_device(name) == 0  # 0 = off, not "unset"
    monkeypatch.setenv(f"SLUICE_{name.upper()}", "none")
    assert ReplicaSettings(device="cpu").for_device(name) == DEVICE_DEFAULTS[name].cpu


def test_the_depth_scale_is_the_models_unless_set(monkeypatch):
    monkeypatch.delenv("SLUICE_PREFILL_DEPTH_SCALE_TOKENS", raising=False)
    assert ReplicaSettings().prefill_depth_scale_tokens is None
    monkeypatch.setenv("SLUICE_PREFILL_DEPTH_SCALE_TOKENS", "none")
    assert ReplicaSettings().prefill_depth_scale_tokens is None
    monkeypatch.setenv("SLUICE_PREFILL_DEPTH_SCALE_TOKENS", "0")
    assert ReplicaSettings().prefill_depth_scale_tokens == 0


def test_the_engine_config_takes_the_device_defaults_and_the_models_depth(monkeypatch):
    for name in (*DEVICE_DEFAULTS, "prefill_depth_scale_tokens"):
        monkeypatch.delenv(f"SLUICE_{name.upper()}", raising=False)
    cpu = ReplicaSettings(device="cpu").scheduler_config(max_model_len_tokens=4096, model_depth_scale_tokens=1416)
    assert (cpu.long_prefill_chunk_tokens, cpu.batch_prefill_tokens_beside_interactive) == (128, 64)
    assert cpu.yield_to_chats is True and cpu.prefill_depth_scale_tokens == 1416 and cpu.max_model_len_tokens == 4096
    cuda = ReplicaSettings(device="cuda").scheduler_config(max_model_len_tokens=8192, model_depth_scale_tokens=50_000)
    assert cuda.yield_to_chats is False and cuda.long_prefill_chunk_tokens == 512
    monkeypatch.setenv("SLUICE_PREFILL_DEPTH_SCALE_TOKENS", "0")
    assert ReplicaSettings().scheduler_config(max_model_len_tokens=4096,
                                              model_depth_scale_tokens=1416).prefill_depth_scale_tokens == 0
