"""`make run` on a bare laptop: no Redis, no database URL. The ledger is a
SQLite file under .sluice/, buckets and idempotency keys live in process."""

import os
import subprocess
import sys
import time

import httpx
import openai
import pytest

from integration.conftest import eventually
from sluice.devstack.stack import LocalStack, StackPorts

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def embedded(tiny_model_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("laptop")
    env_without_services = {"REDIS_URL": "", "SLUICE_DATABASE_URL": ""}
    stack = LocalStack(model_dir=tiny_model_dir, log_dir=workdir / "logs", ports=StackPorts.ephemeral(),
                       cwd=workdir, extra_env=env_without_services)
    with stack.running(timeout_s=180):
        yield stack, workdir


def test_generation_idempotency_and_usage_on_sqlite(embedded):
    stack, workdir = embedded
    client = openai.OpenAI(base_url=stack.gateway_url + "/v1", api_key=stack.api_key, max_retries=0)
    kwargs = dict(model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                  extra_headers={"Idempotency-Key": "laptop-1"}, extra_body={"ignore_eos": True})
    first = client.chat.completions.with_raw_response.create(**kwargs)
    replay = client.chat.completions.with_raw_response.create(**kwargs)
    assert replay.headers["x-sluice-idempotent-replay"] == "true"
    assert replay.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert (workdir / ".sluice" / "ledger.db").exists()
    headers = {"Authorization": f"Bearer {stack.api_key}"}

    def requests_billed() -> int:
        return httpx.get(stack.gateway_url + "/v1/usage", headers=headers, timeout=5).json()["data"][0]["requests"]

    eventually(lambda: requests_billed() == 1)


def test_cli_keys_work_against_the_default_sqlite_ledger(embedded):
    stack, workdir = embedded
    env = {k: v for k, v in os.environ.items() if k not in ("SLUICE_DATABASE_URL",)}
    sluice = os.path.join(os.path.dirname(sys.executable), "sluice")
    key = subprocess.run([sluice, "keys", "create", "--tenant", "laptop-user"], cwd=workdir, env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
    client = openai.OpenAI(base_url=stack.gateway_url + "/v1", api_key=key, max_retries=0)
    deadline = time.monotonic() + 5
    while True:
        try:
            client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "x"}],
                                           max_tokens=1)
            break
        except openai.AuthenticationError:
            assert time.monotonic() < deadline
            time.sleep(0.2)
