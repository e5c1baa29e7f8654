"""One real stack (four processes on loopback ports) shared by the
integration tests, plus helpers to read its Prometheus metrics."""

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluice.devstack.stack import LocalStack, StackPorts


REDIS_URL = "redis://127.0.0.1:6379/0"
# Short, so the slowloris tests end quickly; far above any loopback client's needs.
HTTP_HEADER_TIMEOUT_S = 2.0
HTTP_BODY_TIMEOUT_S = 2.0


@pytest.fixture(scope="session")
def stack_database_url(postgres_session_url: str) -> str:
    """The ledger of the shared stack: a throwaway Postgres database."""
    return postgres_session_url


@pytest.fixture(scope="session")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, stack_database_url: str):
    """The production-like stack: Redis buckets and idempotency keys (a key
    prefix of its own), the ledger in Postgres."""
    log_dir = tmp_path_factory.mktemp("stack-logs")
    local = LocalStack(
        model_dir=tiny_model_dir,
        log_dir=log_dir,
        ports=StackPorts.ephemeral(),
        extra_env={
            "SLUICE_CANARY_INTERVAL_S": "1",
            "SLUICE_LOG_LEVEL": "INFO",
            "REDIS_URL": REDIS_URL,
            "SLUICE_REDIS_KEY_PREFIX": f"sluice-test-{uuid.uuid4().hex[:8]}",
            "SLUICE_DATABASE_URL": stack_database_url,
            "SLUICE_OUTBOX_PATH": str(log_dir / "outbox.db"),
            "SLUICE_INTERACTIVE_MAX_PROMPT_TOKENS": "2048",  # below the 4096 context, so tests can tell them apart
            "SLUICE_HTTP_HEADER_TIMEOUT_S": str(HTTP_HEADER_TIMEOUT_S),
            "SLUICE_HTTP_BODY_TIMEOUT_S": str(HTTP_BODY_TIMEOUT_S),
        },
    )
    with local.running(timeout_s=180):
        yield local


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics page, keyed by (name, sorted labels)."""
    text = httpx.get(url, timeout=5.0).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def metric(samples: dict, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    return sum(
        value for (sample_name, sample_labels), value in samples.items()
        if sample_name == name and set(labels.items()) <= set(sample_labels)
    )


def eventually(check: Callable[[], bool], timeout_s: float = 15.0, interval_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(interval_s)
