"""Ledger records validate at construction and survive the outbox encoding."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest

from sluice.ledger.keys import hash_key
from sluice.ledger.outbox import decode_record, encode_record
from sluice.ledger.records import AttemptRecord, UsageRecord

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
USAGE = dict(tenant="acme", request_id="req-1", model="llama-tiny", model_version="v1",
             prompt_tokens=10, cached_tokens=4, output_tokens=20, finish_reason="stop",
             finished_at=T0)
ATTEMPT = dict(tenant="acme", request_id="req-1", model="llama-tiny", model_version="v1",
               prompt_tokens=10, output_tokens=3, outcome="cancelled", at=T0)


@pytest.mark.parametrize("change", [
    {"finish_reason": "cancelled"},
    {"finished_at": datetime(2025, 3, 1, 12, 0)},
    {"cached_tokens": 11},
    {"output_tokens": -1},
    {"prompt_tokens": 1.5},
    {"tenant": ""},
    {"request_id": ""},
    {"service_class": "flex"},
])
def test_bad_usage_records_are_refused(change):
    with pytest.raises(ValueError):
        UsageRecord(**{**USAGE, **change})


@pytest.mark.parametrize("change", [
    {"outcome": "stop"},
    {"at": datetime(2025, 3, 1)},
    {"prompt_tokens": -3},
    {"attempt_id": ""},
    {"service_class": "bulk"},
])
def test_bad_attempt_records_are_refused(change):
    with pytest.raises(ValueError):
        AttemptRecord(**{**ATTEMPT, **change})


def test_records_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        UsageRecord(**USAGE).output_tokens = 0  # type: ignore[misc]


def test_each_attempt_gets_its_own_id():
    assert AttemptRecord(**ATTEMPT).attempt_id != AttemptRecord(**ATTEMPT).attempt_id


@pytest.mark.parametrize("record", [
    UsageRecord(**{**USAGE, "finished_at": T0.astimezone(timezone(timedelta(hours=5, minutes=30)))}),
    UsageRecord(**{**USAGE, "finish_reason": "length"}),
    AttemptRecord(**{**ATTEMPT, "outcome": "error"}),
    UsageRecord(**{**USAGE, "service_class": "batch"}),
    AttemptRecord(**{**ATTEMPT, "service_class": "batch"}),
])
def test_outbox_encoding_round_trips(record):
    decoded = decode_record(*encode_record(record))
    assert decoded == record
    assert type(decoded) is type(record)


@pytest.mark.parametrize(("kind", "payload"), [
    # Written by a gateway from before service_class existed, still queued
    # in its outbox file when the new gateway starts and drains it.
    ("usage", '{"tenant":"acme","request_id":"req-1","model":"llama-tiny","model_version":"v1",'
              '"prompt_tokens":10,"cached_tokens":4,"output_tokens":20,"finish_reason":"stop",'
              '"finished_at":"2025-03-01T12:00:00+00:00"}'),
    ("attempt", '{"tenant":"acme","request_id":"req-1","model":"llama-tiny","model_version":"v1",'
                '"prompt_tokens":10,"output_tokens":3,"outcome":"cancelled",'
                '"at":"2025-03-01T12:00:00+00:00","attempt_id":"abc"}'),
])
def test_outbox_entries_from_before_service_class_decode_as_interactive(kind, payload):
    record = decode_record(kind, payload)
    assert record.service_class == "interactive"
    assert record.tenant == "acme" and record.prompt_tokens == 10


def test_unknown_kind_does_not_decode():
    with pytest.raises(ValueError, match="kind"):
        decode_record("refund", "{}")


def test_hash_key_is_sha256_hex():
    # sha256("abc"), the FIPS 180-2 test vector
    assert hash_key("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
