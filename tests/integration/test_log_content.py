"""No prompt or output text in any service's log, even at DEBUG: a streamed
and a non-streamed chat completion through the four real processes, with
JSON logs and tracing on (so the instrumentation's own logging is read
too), then every log line of every process is searched."""

import json
import uuid
from pathlib import Path

import openai
import pytest

from integration.otlp_receiver import OtlpReceiver, tracing_env
from sluice.devstack.stack import LocalStack, StackPorts

pytestmark = pytest.mark.stack

# Distinctive enough that it cannot appear in a log line by chance.
PROMPT = "Confidential-7f3a: the launch code is zebra-quartz-5512"
SERVICES = ("gateway", "router", "scheduler", "replica")  # their log files in the stack's log_dir


@pytest.fixture(scope="module")
def debug_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    log_dir = tmp_path_factory.mktemp("debug-stack")
    with OtlpReceiver().running() as receiver:
        local = LocalStack(
            model_dir=tiny_model_dir, log_dir=log_dir, ports=StackPorts.ephemeral(),
            extra_env={
                **tracing_env(receiver.endpoint),
                "SLUICE_CANARY_INTERVAL_S": "1",
                "SLUICE_LOG_LEVEL": "DEBUG",
                "SLUICE_LOG_FORMAT": "json",
                "SLUICE_DATABASE_URL": f"sqlite:///{log_dir / 'ledger.db'}",
                "SLUICE_OUTBOX_PATH": str(log_dir / "outbox.db"),
                "SLUICE_REDIS_KEY_PREFIX": f"sluice-logs-{uuid.uuid4().hex[:8]}",
            },
        )
        with local.running(timeout_s=180):
            yield local


def _log_lines(stack: LocalStack, name: str) -> list[str]:
    return (stack.log_dir / f"{name}.log").read_text(errors="replace").splitlines()


def test_no_prompt_or_output_text_in_any_log_at_debug(debug_stack: LocalStack):
    client = openai.OpenAI(base_url=debug_stack.gateway_url + "/v1", api_key=debug_stack.api_key, max_retries=0)
    messages = [{"role": "user", "content": PROMPT}]
    kwargs = dict(model="tiny-llama", messages=messages, max_tokens=32, temperature=0,
                  extra_body={"ignore_eos": True})
    streamed = "".join(c.choices[0].delta.content or ""
                       for c in client.chat.completions.create(stream=True, **kwargs) if c.choices)
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    assert streamed == whole
    # 32 tokens of text: a string that long does not turn up in a log by chance.
    assert len(streamed.strip()) >= 20, streamed
    debug_stack.stop()  # flushes every buffered log line and span

    for name in SERVICES:
        lines = _log_lines(debug_stack, name)
        text = "\n".join(lines)
        assert "zebra-quartz" not in text and "Confidential-7f3a" not in text, f"the prompt is in {name}'s log"
        assert streamed.strip() not in text, f"the output is in {name}'s log"
        entries = [json.loads(line) for line in lines]  # SLUICE_LOG_FORMAT=json: every line is one object
        assert any(entry["level"] == "DEBUG" for entry in entries), (
            f"{name} logged nothing at DEBUG: the test would not see content logged there")
        assert {entry["service"] for entry in entries} == {name}
