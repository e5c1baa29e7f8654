"""Shared pieces of the cluster benchmarks (bench/bench_cluster_*.py).

    with cluster({"SLUICE_MAX_NUM_SEQS": "16"}) as c:     # a LocalStack of its own
        key = c.create_key("tenant-a", tokens_per_minute=20_000)   # the real `sluice keys create`
        async with c.client() as client:
            record = await stream_chat(client, key, "tenant-a", prompt, max_tokens=64)

Each cluster runs in a temp dir with its own SQLite ledger and in-process
buckets (no Redis), on ephemeral loopback ports. The client streams SSE with
the lean `load_client.LoadClient` (httpx cost the load client, which shares
the cores with the stack, more CPU per request than the gateway spent) and
asks for `continuous_usage_stats`, so every engine step that produced a
token arrives as one chunk carrying the cumulative output count: time to
first token, inter-token gaps and tokens in a window are per token step,
not per detokenized word; each is stamped when the client read its bytes.
Closed-loop workers each get a client (and so a connection) of their own
(`worker_clients`). A refusal is recorded with its status,
Retry-After, retry-after-ms and x-sluice-reject-reason, and how long it took.

Timings are time.monotonic() seconds; cluster_stats has the /metrics
sampler, percentiles and the printing helpers.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from load_client import LoadClient

from sluice.devstack.stack import LocalStack, StackPorts

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / ".sluice" / "models" / "tiny-llama"
MODEL = "tiny-llama"
SLUICE_CLI = Path(sys.executable).parent / "sluice"
# The gateway re-reads keys every 2 s (SLUICE_KEY_REFRESH_INTERVAL_S).
KEY_VISIBLE_TIMEOUT_S = 10.0


class StackFailed(RuntimeError):
    """The stack did not come up or a service died: the script exits non-zero."""


# ---------------------------------------------------------------- the stack


@dataclass
class Cluster:
    stack: LocalStack
    workdir: Path
    database_url: str

    def create_key(self, tenant: str, *, tokens_per_minute: int | None = None,
                   requests_per_minute: int | None = None, max_concurrency: int | None = None,
                   wait: bool = True) -> str:
        """A key minted by the real CLI against this stack's ledger; with
        `wait`, returned once the gateway accepts it (see wait_for_key)."""
        command = [str(SLUICE_CLI), "keys", "create", "--tenant", tenant]
        for flag, value in (("--tokens-per-minute", tokens_per_minute),
                            ("--requests-per-minute", requests_per_minute),
                            ("--max-concurrency", max_concurrency)):
            if value is not None:
                command += [flag, str(value)]
        env = {**os.environ, "SLUICE_DATABASE_URL": self.database_url}
        key = subprocess.run(command, env=env, cwd=self.workdir, capture_output=True, text=True,
                             check=True, timeout=60).stdout.strip()
        if wait:
            self.wait_for_key(key)
        return key

    def wait_for_key(self, key: str) -> None:
        deadline = time.monotonic() + KEY_VISIBLE_TIMEOUT_S
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                response = client.get(self.stack.gateway_url + "/v1/models",
                                      headers={"Authorization": f"Bearer {key}"})
                if response.status_code == 200:
                    return
                time.sleep(0.2)
        raise StackFailed(f"gateway did not accept a new key within {KEY_VISIBLE_TIMEOUT_S}s")

    @contextlib.asynccontextmanager
    async def client(self) -> AsyncIterator[LoadClient]:
        """A client opening a connection per concurrent request (idle ones are reused)."""
        client = LoadClient(*self._gateway_address())
        try:
            yield client
        finally:
            client.close()

    @contextlib.asynccontextmanager
    async def worker_clients(self, count: int) -> AsyncIterator[list[LoadClient]]:
        """One client per closed-loop worker: each keeps its one connection."""
        clients = [LoadClient(*self._gateway_address()) for _ in range(count)]
        try:
            yield clients
        finally:
            for client in clients:
                client.close()

    def _gateway_address(self) -> tuple[str, int]:
        url = httpx.URL(self.stack.gateway_url)
        return url.host, url.port

    def metrics_url(self, service: str = "scheduler", index: int = 0) -> str:
        return self.stack.metrics_url(service, index)


@contextlib.contextmanager
def cluster(env: dict[str, str], *, num_replicas: int = 1, replica_env: dict[int, dict[str, str]] | None = None,
            label: str = "cluster") -> Iterator[Cluster]:
    """A fresh stack with `env` over every service; stopped on exit."""
    with tempfile.TemporaryDirectory(prefix=f"sluice-{label}-") as tmp:
        workdir = Path(tmp)
        database_url = f"sqlite:///{workdir / 'ledger.db'}"
        extra_env = {
            "REDIS_URL": "",  # in-process buckets: one gateway
            "SLUICE_DATABASE_URL": database_url,
            "SLUICE_OUTBOX_PATH": str(workdir / "outbox.db"),
            "SLUICE_LOG_LEVEL": "WARNING",
            **env,
        }
        stack = LocalStack(model_dir=MODEL_DIR, log_dir=workdir / "logs", cwd=workdir,
                           ports=StackPorts.ephemeral(num_replicas), num_replicas=num_replicas,
                           replica_env=replica_env or {}, extra_env=extra_env)
        stack.start()
        try:
            try:
                stack.wait_ready(timeout_s=180)
            except (TimeoutError, RuntimeError) as error:
                raise StackFailed(str(error)) from None
            yield Cluster(stack, workdir, database_url)
            stack.check_alive()
        except RuntimeError as error:  # a service died under load
            raise StackFailed(str(error)) from None
        finally:
            stack.stop()


def run_main(main: Callable[[], Awaitable[int]]) -> int:
    """asyncio.run(main()), mapping a failed stack to exit status 1. The
    load average is printed before and after: the phases of a run are side
    by side in time, so other work on the machine between them shifts the
    ratios, and a reader should be able to see that it was there."""
    print(f"load average before: {_load()}", flush=True)
    try:
        return asyncio.run(main())
    except StackFailed as error:
        print(f"STACK FAILED: {error}", file=sys.stderr)
        return 1
    finally:
        print(f"load average after: {_load()} ({os.cpu_count()} CPUs)", flush=True)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, for a bench to print beside
    its figures ("unknown" where there is none)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


# ----------------------------------------------------------------- prompts


class PromptMaker:
    """User messages of a given token length from the model's own tokenizer.

    Each prompt starts with a distinct random word sequence, so prefix
    caching cannot make one request cheap because of another.
    """

    def __init__(self, model_dir: Path = MODEL_DIR, seed: int = 0) -> None:
        from tokenizers import Tokenizer  # the router's tokenizer library

        self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._random = random.Random(seed)
        # Whole words: a token that starts with the tokenizer's space marker
        # (sentencepiece's "\u2581", byte-level BPE's "\u0120"). Without
        # any, every prompt would be one word repeated, and prompts meant to
        # differ (the prefix-placement bench's system prompts) identical.
        vocab = [t[1:] for t in self._tokenizer.get_vocab() if t[:1] in ("\u2581", "\u0120") and t[1:].isalpha()]
        self._words = sorted(w for w in vocab if 2 <= len(w) <= 7)[:4000]
        if len(self._words) < 100:
            raise RuntimeError(f"{model_dir}: too few whole-word tokens to make distinct prompts")

    def text(self, tokens: int) -> str:
        words = " ".join(self._random.choice(self._words) for _ in range(tokens))
        ids = self._tokenizer.encode(words, add_special_tokens=False).ids[:tokens]
        return self._tokenizer.decode(ids)

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def pool(self, tokens: int, size: int = 64) -> "PromptPool":
        return PromptPool([self.text(tokens) for _ in range(size)])


class PromptPool:
    """Prompts made before timing starts (making one costs milliseconds of
    the client's CPU, which it shares with the services). `next()` cycles
    through them, each behind a fresh number, so a reused text still shares
    no prefix block with its earlier use."""

    def __init__(self, texts: list[str]) -> None:
        self._texts = texts
        self._count = 0

    def next(self) -> str:
        self._count += 1
        return f"{self._count} {self._texts[self._count % len(self._texts)]}"


def context_tokens(model_dir: Path = MODEL_DIR) -> int:
    return json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]


# ------------------------------------------------------------------ client


@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it. `token_times_s[i]` is when the
    output count reached `token_counts[i]` (one entry per chunk)."""

    tenant: str
    service_class: str  # "interactive" or "batch"
    sent_s: float
    status: int | None = None
    reject_reason: str | None = None
    retry_after_s: float | None = None  # the Retry-After header (whole seconds)
    retry_after_ms: float | None = None  # the retry-after-ms header, when sent
    answered_s: float | None = None  # response headers arrived
    token_times_s: list[float] = field(default_factory=list)
    token_counts: list[int] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None  # from the final usage
    finished: bool = False
    cancelled: bool = False  # the client stopped it (window over)
    error: str | None = None  # transport error or an SSE error event

    @property
    def refused(self) -> bool:
        return self.status is not None and self.status != 200

    @property
    def time_to_answer_s(self) -> float | None:
        return None if self.answered_s is None else self.answered_s - self.sent_s

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] - self.sent_s if self.token_times_s else None

    @property
    def first_token_s(self) -> float | None:
        return self.token_times_s[0] if self.token_times_s else None

    @property
    def tokens_received(self) -> int:
        return self.token_counts[-1] if self.token_counts else 0

    def inter_token_gaps_s(self) -> list[float]:
        """Seconds per output token between consecutive chunks."""
        gaps = []
        for i in range(1, len(self.token_times_s)):
            tokens = self.token_counts[i] - self.token_counts[i - 1]
            if tokens > 0:
                gaps.append((self.token_times_s[i] - self.token_times_s[i - 1]) / tokens)
        return gaps

    def tokens_between(self, start_s: float, end_s: float) -> int:
        """Output tokens that arrived in [start_s, end_s)."""
        before = at_end = 0
        for t, count in zip(self.token_times_s, self.token_counts):
            if t < start_s:
                before = count
            if t < end_s:
                at_end = count
        return at_end - before

    def suggested_retry_s(self) -> float | None:
        """retry-after-ms when given, else Retry-After."""
        if self.retry_after_ms is not None:
            return self.retry_after_ms / 1000.0
        return self.retry_after_s


def _float_header(headers: dict[str, str], name: str) -> float | None:
    value = headers.get(name)
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


async def stream_chat(client: LoadClient, key: str, tenant: str, prompt: str, *, max_tokens: int,
                      service_tier: str | None = None, ignore_eos: bool = True,
                      sink: list[RequestRecord] | None = None) -> RequestRecord:
    """One streaming chat completion, recorded (and appended to `sink` as
    soon as it is sent, so a cancelled one keeps what it received); never
    raises for HTTP or transport failures (they land in the record).
    Cancellation leaves `cancelled` set, closes the connection (the stack
    sees the client leave) and re-raises."""
    body = {
        "model": MODEL, "stream": True, "max_tokens": max_tokens, "ignore_eos": ignore_eos, "temperature": 0,
        "messages": [{"role": "user", "content": prompt}],
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if service_tier is not None:
        body["service_tier"] = service_tier
    record = RequestRecord(tenant, "batch" if service_tier == "flex" else "interactive", time.monotonic())
    if sink is not None:
        sink.append(record)
    events = _EventReader(record)
    try:
        response = await client.post("/v1/chat/completions", json.dumps(body).encode(),
                                     {"Authorization": f"Bearer {key}"}, on_body=events.feed)
        record.answered_s = time.monotonic()
        record.status = response.status
        if response.status != 200:
            events.record = None  # the error body is not an event stream
            record.reject_reason = response.headers.get("x-sluice-reject-reason")
            record.retry_after_s = _float_header(response.headers, "retry-after")
            record.retry_after_ms = _float_header(response.headers, "retry-after-ms")
        await response.finished
    except asyncio.CancelledError:
        record.cancelled = True
        raise
    except (OSError, asyncio.TimeoutError) as error:  # ConnectionFailed is an OSError
        record.error = f"{type(error).__name__}: {error}"
    return record


class _EventReader:
    """The SSE body of one stream, fed as the parser hands it over: each
    `data:` event updates the record, stamped when its bytes were read."""

    __slots__ = ("record", "_pending")

    def __init__(self, record: RequestRecord) -> None:
        self.record: RequestRecord | None = record
        self._pending = b""

    def feed(self, data: bytes) -> None:
        if self.record is None:
            return
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()  # an incomplete last line waits for the rest
        now_s = time.monotonic()
        for line in lines:
            if line.startswith(b"data: "):
                self._event(line[6:].rstrip(b"\r"), now_s)

    def _event(self, data: bytes, now_s: float) -> None:
        record = self.record
        if data == b"[DONE]":
            record.finished = record.error is None
            return
        event = json.loads(data)
        if "error" in event:
            record.error = str(event["error"].get("code") or event["error"].get("message"))
            return
        usage = event.get("usage")
        if not usage:
            return
        if record.prompt_tokens is None:
            record.prompt_tokens = usage["prompt_tokens"]
        if event.get("choices"):  # a delta with the running count
            count = usage["completion_tokens"]
            if count > record.tokens_received:
                record.token_times_s.append(now_s)
                record.token_counts.append(count)
        else:  # the final usage chunk
            record.output_tokens = usage["completion_tokens"]


async def warm_up(cluster_: "Cluster", prompts: PromptMaker) -> None:
    """A few requests of each size before anything is measured, so no
    baseline pays for first-call costs (allocator growth, lazy paths). They
    go out on the stack's dev key (tenant "dev"), so no measured tenant's
    counters include them."""
    key = cluster_.stack.api_key
    long, short = prompts.pool(1500, 2), prompts.pool(32, 8)
    async with cluster_.client() as client:
        for _ in range(2):
            await asyncio.gather(stream_chat(client, key, "warm-up", long.next(), max_tokens=8),
                                 *(stream_chat(client, key, "warm-up", short.next(), max_tokens=16)
                                   for _ in range(4)))
    # The client's own start-up heap (httpx, the tokenizer, the stack's
    # handles) out of its later full collections: a 15-20 ms pause of this
    # process's event loop would show up as the stack's latency.
    gc.collect()
    gc.freeze()


# ------------------------------------------------------------------ load shapes


# `send(i)` sends one request (stream_chat with a sink) and returns its record.
Send = Callable[[int], Awaitable[RequestRecord]]


async def closed_loop(concurrency: int, duration_s: float, send: Send, *, pause_after_refusal_s: float = 0.0,
                      honour_retry_after: bool = False) -> None:
    """`concurrency` workers, each sending one request after another until
    `duration_s` is over; then whatever is still in flight is cancelled (the
    client disconnects, which cancels generation). A worker whose request was
    refused waits `pause_after_refusal_s` before the next, or with
    `honour_retry_after` the wait the refusal suggested (that pause when it
    suggested none)."""
    deadline = time.monotonic() + duration_s

    async def worker(index: int) -> None:
        while time.monotonic() < deadline:
            record = await send(index)
            if record.refused or record.error:
                suggested = record.suggested_retry_s() if honour_retry_after else None
                pause_s = suggested if suggested is not None else pause_after_refusal_s
                await asyncio.sleep(min(pause_s, max(0.0, deadline - time.monotonic())))

    await run_until(deadline, [worker(i) for i in range(concurrency)])


async def open_loop(rate_per_s: float, duration_s: float, send: Send, *, grace_s: float = 30.0) -> None:
    """A request every 1/rate seconds for `duration_s`, each on its own task;
    those still running `grace_s` after the last send are cancelled."""
    tasks = []
    start = time.monotonic()
    for index in range(int(rate_per_s * duration_s)):
        await asyncio.sleep(max(0.0, start + index / rate_per_s - time.monotonic()))
        tasks.append(asyncio.ensure_future(send(index)))
    await run_until(time.monotonic() + grace_s, tasks)


async def run_until(deadline: float, coroutines: list) -> None:
    """Run them together; cancel whatever is left at `deadline`."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    if tasks:
        await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
    await cancel_all(tasks)


async def cancel_all(tasks: list[asyncio.Future]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
