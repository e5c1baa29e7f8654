"""`sluice rollout` on live metrics: the two-version local stack (tiny-llama
v1 = the 4-layer model, v2 = the 2-layer one with the same tokenizer), a
real Prometheus scraping it every second, a small steady load, and the
rollout CLI in its own process with the catalog-file adapter.

The first rollout runs the quality gate (lenient thresholds: the two
versions are different random weights, so only the lenient gate passes
them), then walks 25 -> 50 -> 100 % on the gateway's per-version metrics
with a few seconds' dwell each, and completes: the catalog ends 0/100 and
new requests are served by v2, with no restart. The second, from 100/0
again, has an impossible TTFT limit and rolls back at its first judged
step.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import pytest

from sluice.devstack.catalog import V1, V2, two_versions
from sluice.devstack.stack import LocalStack, StackPorts
from sluice.rollout.local_store import LocalCatalogStore
from sluice.rollout.weights import alias_weights
from support.prometheus_server import running_prometheus

pytestmark = pytest.mark.stack

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRAPE_INTERVAL_S = 1.0
ROLLOUT_TIMEOUT_S = 120  # bounds a slow CI machine; the walk itself takes ~20 s here
# A step is judged once v2 finished this many requests in it, after this dwell.
FAST_STEPS = ["--steps", "25,50,100", "--dwell-s", "4", "--min-requests", "3", "--poll-s", "1",
              "--min-window-s", "3", "--max-step-s", "60"]
# Gates a healthy tiny model on a busy CPU passes by far; relative ones off
# (v2, the 2-layer model, differs from v1 by design).
LENIENT_GATES = ["--max-ttft-p99-s", "30", "--max-itl-p99-s", "10", "--max-error-rate", "0.2",
                 "--max-ttft-p99-ratio", "off", "--max-itl-p99-ratio", "off", "--max-error-rate-increase", "off"]




@pytest.fixture(scope="module")
def two_version_stack(tiny_model_dir, small_model_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("rollout-live")
    stack = LocalStack(
        model_dir=tiny_model_dir, log_dir=workdir / "logs", ports=StackPorts.ephemeral(num_replicas=2),
        cwd=workdir, num_replicas=2, catalog=two_versions(tiny_model_dir, small_model_dir, (100, 0)),
        extra_env={"REDIS_URL": "", "SLUICE_DATABASE_URL": "", "SLUICE_KV_CACHE_BLOCKS": "256",
                   "SLUICE_CANARY_INTERVAL_S": "1", "SLUICE_CATALOG_RELOAD_INTERVAL_S": "0.2"},
    )
    with stack.running(timeout_s=180):
        yield stack


@pytest.fixture(scope="module")
def prometheus(two_version_stack, tmp_path_factory):
    with running_prometheus(two_version_stack, tmp_path_factory.mktemp("rollout-prometheus"),
                            SCRAPE_INTERVAL_S) as url:
        yield url


class SteadyLoad:
    """Two clients streaming short interactive requests back to back, each
    with a fresh idempotency key (so the weights split them); counts which
    version served each."""

    def __init__(self, stack: LocalStack) -> None:
        self.stack = stack
        self.served: Counter[str] = Counter()
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(2)]

    def __enter__(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _run(self) -> None:
        with httpx.Client(base_url=self.stack.gateway_url, timeout=30) as client:
            while not self._stop.is_set():
                version = served_by(client, self.stack, stream=True)
                if version.startswith("error"):
                    self.failures.append(version)
                else:
                    self.served[version] += 1


def served_by(client: httpx.Client, stack: LocalStack, *, stream: bool = False) -> str:
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "ignore_eos": True, "stream": stream}
    headers = {"Authorization": f"Bearer {stack.api_key}", "Idempotency-Key": uuid.uuid4().hex}
    if not stream:
        response = client.post("/v1/chat/completions", json=body, headers=headers)
        return response.json()["system_fingerprint"] if response.status_code == 200 else f"error {response.text}"
    fingerprint = None
    with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        if response.status_code != 200:
            return f"error {response.status_code}"
        for line in response.iter_lines():
            if line.startswith("data: {"):
                fingerprint = fingerprint or json.loads(line[6:]).get("system_fingerprint")
    return fingerprint or "error: no fingerprint"


def rollout(stack: LocalStack, prometheus_url: str, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "sluice.rollout", "start", "--alias", "tiny-llama", "--candidate", V2,
               "--catalog", str(stack.models_file), "--prometheus", prometheus_url, *FAST_STEPS, *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=ROLLOUT_TIMEOUT_S)


def catalog_weights(stack: LocalStack) -> tuple:
    return alias_weights(LocalCatalogStore(stack.models_file).read_catalog(), "tiny-llama").weights


@pytest.mark.timeout(420)
def test_a_rollout_walks_its_steps_on_live_metrics_then_an_impossible_gate_rolls_back(
        two_version_stack, prometheus, tmp_path):
    stack = two_version_stack
    prompts = tmp_path / "prompts.json"  # two prompts keep the quality gate short on a CPU
    builtin = json.loads((REPO_ROOT / "libs/rollout/src/sluice/rollout/quality/prompts.json").read_text())
    prompts.write_text(json.dumps({**builtin, "prompts": builtin["prompts"][:2], "max_new_tokens": 4}))
    with SteadyLoad(stack) as load:
        completed = rollout(stack, prometheus, *LENIENT_GATES, "--prompts", str(prompts),
                            "--min-greedy-agreement", "0", "--max-logprob-drop", "10",
                            "--max-check-regressions", "100")
        assert completed.returncode == 0, completed.stderr
        assert catalog_weights(stack) == ((V1, 0), (V2, 100))
        with httpx.Client(base_url=stack.gateway_url, timeout=30) as client:
            after = Counter(served_by(client, stack) for _ in range(8))
    log = completed.stderr
    assert "quality check passed" in log
    assert log.index("quality check passed") < log.index("25% of tiny-llama")  # no traffic before the gate
    for passed in ("step 25% passed", "step 50% passed", "step 100% passed", "rollout completed"):
        assert passed in log, log
    assert not load.failures, load.failures[:3]
    assert load.served[V1] > 0 and load.served[V2] > 0  # both served while the weights moved
    assert after == Counter({V2: 8})  # the cut took effect without a restart

    stack.write_catalog(two_versions(stack.model_dir, stack.catalog.versions[1].model_dir, (100, 0)))
    with SteadyLoad(stack) as load:
        rolled_back = rollout(stack, prometheus, "--skip-quality", *LENIENT_GATES, "--max-ttft-p99-s", "0.001")
    assert rolled_back.returncode == 1, rolled_back.stderr
    assert "SLO breach at 25%: TTFT p99" in rolled_back.stderr
    assert catalog_weights(stack) == ((V1, 100), (V2, 0))
    status = subprocess.run([sys.executable, "-m", "sluice.rollout", "status", "--catalog", str(stack.models_file)],
                            capture_output=True, text=True, timeout=30)
    assert "rolled_back" in status.stdout and "SLO breach" in status.stdout
