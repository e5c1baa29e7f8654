"""Where the whole stack's CPU goes under the peer benchmark's load.

Starts the local multi-process stack (gateway, router, scheduler, one
replica), drives it with the shape of bench/peer_stack_vs_vllm.py (64
concurrent streaming chats, 128 prompt / 128 output tokens, greedy,
ignore_eos, 128 requests) from this process, and prints per process:

- CPU seconds per 1,000 output tokens (user + system, all threads, from
  /proc/<pid>/stat around the measured run; the load client is this
  process);
- with --py-spy, the functions that process spent its samples in (py-spy
  record, non-blocking, 100 Hz; self time by function and the heaviest
  inclusive frames), so the next change starts from a profile;
- per process, the cores' worth of time its threads ran and were
  runnable but waiting for a core (/proc/<pid>/task/*/schedstat), and for
  the replica the engine thread apart: a service whose threads wait while
  it has work is short of CPU, which CPU seconds alone do not show;
- the engine's mean step time and tokens per step in the stack (the
  replica's sluice_engine_step_duration_seconds) beside the same requests
  run through the same engine core with no services around it;
- a ceiling: the model's linear layers alone (each timed on one thread at
  this load's batch, 64 rows for decode and 512 for prefill, the faster of
  torch's F.linear and oneDNN's packed weight, as the replica chooses; for
  a greedy step's LM head also its bf16 and int8 screens, whose tokens
  are exact)
  give the least CPU the replica can spend per 1,000 output tokens while
  its arithmetic stays float32 (the logits must match transformers'). With
  the other processes' measured CPU beside it, the cores can serve at most
  cores / (that + theirs) output tokens per second, however cheap attention,
  sampling, scheduling and Python became.

    .venv/bin/python bench/profile_stack.py [--rounds 2] [--py-spy] [--json PATH]

py-spy comes from requirements-dev.txt; it needs ptrace (root, or
kernel.yama.ptrace_scope 0). Loopback only, bounded by the request count.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_harness import MODEL, MODEL_DIR, PromptMaker, cpu_model  # noqa: E402
from cluster_stats import CoreWaits, metric_value, parse_metrics, process_cpu_s  # noqa: E402

from sluice.devstack.stack import LocalStack, StackPorts  # noqa: E402

CONCURRENCY, REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS = 64, 128, 128, 128
PREFILL_ROWS = 512  # a prefill step's tokens under the replica's default budget
PY_SPY_RATE_HZ = 100


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ------------------------------------------------------------------ the load


@dataclass(slots=True)
class LoadResult:
    wall_s: float
    output_tokens: int
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    errors: int = 0


async def one_stream(client: httpx.AsyncClient, key: str, prompt: str, result: LoadResult) -> None:
    body = {"model": MODEL, "stream": True, "max_tokens": OUTPUT_TOKENS, "ignore_eos": True, "temperature": 0,
            "messages": [{"role": "user", "content": prompt}], "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    first = last = None
    output_tokens = 0
    async with client.stream("POST", "/v1/chat/completions", json=body,
                             headers={"Authorization": f"Bearer {key}"}) as response:
        if response.status_code != 200:
            result.errors += 1
            await response.aread()
            return
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                output_tokens = event["usage"]["completion_tokens"]
            if any((choice.get("delta") or {}).get("content") for choice in event.get("choices") or ()):
                last = time.perf_counter()
                first = first or last
    if first is None:
        result.errors += 1
        return
    result.output_tokens += output_tokens
    result.ttft_s.append(first - sent)
    if output_tokens > 1:
        result.tpot_s.append((last - first) / (output_tokens - 1))


async def drive(base_url: str, key: str, prompts: list[str]) -> LoadResult:
    """Closed loop: CONCURRENCY workers, each with a one-connection client
    of its own (a shared httpx pool costs the client more CPU than some of
    the services it measures), pulling from the fixed list of prompts."""
    queue = list(reversed(prompts))
    result = LoadResult(0.0, 0)

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            await one_stream(client, key, queue.pop(), result)

    # The clients are made before the clock starts: each builds an SSL
    # context (~17 ms of this loop's time, even for plain http), and made
    # by the workers as they start, the 64 of them held the loop for ~1 s
    # while the first requests' answers waited to be read (a p99 TTFT of
    # 1.1-1.4 s where the peer benchmark's client saw ~0.4 s).
    async with contextlib.AsyncExitStack() as clients:
        workers = [worker(await clients.enter_async_context(httpx.AsyncClient(
            base_url=base_url, timeout=300, limits=httpx.Limits(max_connections=1))))
            for _ in range(CONCURRENCY)]
        started = time.perf_counter()
        await asyncio.gather(*workers)
        result.wall_s = time.perf_counter() - started
    return result


# ------------------------------------------------------------------ py-spy


def start_py_spy(pids: dict[str, int], out_dir: Path) -> dict[str, subprocess.Popen]:
    binary = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(binary).exists():
        raise SystemExit("py-spy is not installed (pip install -r requirements-dev.txt)")
    return {name: subprocess.Popen(
        [binary, "record", "--pid", str(pid), "--rate", str(PY_SPY_RATE_HZ), "--nonblocking",
         "--format", "raw", "--output", str(out_dir / f"{name}.txt")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for name, pid in pids.items()}


def stop_py_spy(recorders: dict[str, subprocess.Popen]) -> None:
    for recorder in recorders.values():
        recorder.send_signal(2)  # SIGINT: py-spy writes what it has and exits
    for recorder in recorders.values():
        recorder.wait(timeout=60)


def frame_name(frame: str) -> str:
    """'handle (sluice/gateway/sse.py:12)' -> 'handle (sse.py)': one name per
    function, whatever line of it was running."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({'/'.join(Path(path).parts[-2:])})"


def summarise_py_spy(path: Path, top: int) -> dict:
    self_samples: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [frame_name(f) for f in stack.split(";")[1:]]  # the first is the thread
        if not frames:
            continue
        total += count
        self_samples[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
    return {"samples": total, "self": self_samples.most_common(top), "inclusive": inclusive.most_common(top * 2)}


def print_py_spy(name: str, summary: dict) -> None:
    total = summary["samples"] or 1
    print(f"  {name}: {summary['samples']} samples ({summary['samples'] / PY_SPY_RATE_HZ:.1f} s on a CPU)")
    print("    self:      " + "\n               ".join(f"{100 * n / total:5.1f}%  {f}" for f, n in summary["self"]))
    print("    inclusive: " + "\n               ".join(f"{100 * n / total:5.1f}%  {f}" for f, n in summary["inclusive"]))


def print_core_waits(waits: dict[str, dict[str, float]]) -> None:
    """A process that is short of CPU shows as time its threads were
    runnable but not on a core; its busiest thread is, for the replica, the
    engine's (the model runs there)."""
    if not waits:
        print("  (no per-thread scheduler statistics on this kernel)")
        return
    print("  cores' worth on a core / runnable but waiting for one: " + ", ".join(
        f"{name} {w['on_core']:.2f} / {w['waiting']:.2f}" for name, w in waits.items()))
    replica = waits.get("replica")
    if replica:
        print(f"  replica's busiest thread (the engine's): {replica['busiest_on_core']:.0%} of the time on a core, "
              f"{replica['busiest_waiting']:.0%} waiting for one; {replica['busiest_preempted_per_s']:,.0f} "
              f"preemptions and {replica['busiest_blocked_per_s']:,.0f} blocking waits a second")


# ------------------------------------------------------------------ engine alone


def engine_alone(model_dir: Path, prompts: list[list[int]]) -> dict:
    """The same requests through the replica's engine core and executor in
    this process, no services: its step time is what the stack should reach."""
    from engine_harness import build, greedy_request, run_to_completion, tune_process

    tune_process()
    core, executor = build(model_dir, budget=2048, max_seqs=128)
    run_to_completion(core, executor, [(0.0, greedy_request("warm", prompts[0], 4))])
    wall_s, tokens, steps = 0.0, 0, 0
    # In waves of CONCURRENCY: the stack never holds more than the load's
    # concurrency, and a step's cost depends on how many sequences it holds.
    for start in range(0, len(prompts), CONCURRENCY):
        wave = [(0.0, greedy_request(f"r{start + i}", p, OUTPUT_TOKENS))
                for i, p in enumerate(prompts[start:start + CONCURRENCY])]
        stats = run_to_completion(core, executor, wave)
        wall_s, tokens, steps = wall_s + stats.wall_s, tokens + stats.output_tokens, steps + stats.steps
    return {"output_tokens_per_s": tokens / wall_s, "steps": steps, "mean_step_ms": 1000 * wall_s / steps,
            "tokens_per_step": tokens / steps}


def linear_floor(model_dir: Path) -> dict:
    """CPU seconds per 1,000 output tokens of this load that the model's
    linear layers alone cost, on one thread (see the module docstring)."""
    import torch

    from sluice.model.cpu_fast_path import LinearShape, model_linears, probe_linears
    from sluice.model.llama import LlamaModel
    from sluice.model.loader import load_config

    with torch.device("meta"):
        linears = model_linears(LlamaModel(load_config(model_dir)))
    shapes = {name: LinearShape(m.in_features, m.out_features, m.bias is not None) for name, m in linears.items()}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # The load is greedy: its head may be the screen (sluice.model.greedy_head).
        decode = probe_linears(shapes.values(), rows=CONCURRENCY, head=shapes["lm_head"])
        prefill = probe_linears(shapes.values(), rows=PREFILL_ROWS)
    finally:
        torch.set_num_threads(threads)

    def fastest(timings: dict, name: str) -> float:
        return min(timings[shapes[name].key].values())

    head = "lm_head"
    decode_s = sum(fastest(decode, name) for name in shapes) / CONCURRENCY  # one decode token, every linear
    head_s = fastest(decode, head) / CONCURRENCY
    prefill_s = sum(fastest(prefill, name) for name in shapes if name != head) / PREFILL_ROWS
    # A request: its prompt through the layers, the head once for its first
    # token, then a decode step for each later token.
    per_request_s = PROMPT_TOKENS * prefill_s + head_s + (OUTPUT_TOKENS - 1) * decode_s
    flops_per_request = 2 * sum(
        (PROMPT_TOKENS if name != head else 1) * m.in_features * m.out_features
        + (OUTPUT_TOKENS - 1) * m.in_features * m.out_features for name, m in linears.items())
    return {"cpu_s_per_1k_output_tokens": 1000 * per_request_s / OUTPUT_TOKENS,
            "lm_head_share": (OUTPUT_TOKENS * head_s) / per_request_s,
            "gflop_per_s": flops_per_request / per_request_s / 1e9}


def ceiling(floor: dict, others_s_per_1k: float, cores: int) -> float:
    return cores * 1000 / (floor["cpu_s_per_1k_output_tokens"] + others_s_per_1k)


# ------------------------------------------------------------------ one round


def engine_counters(stack: LocalStack) -> tuple[float, float, float]:
    samples = parse_metrics(httpx.get(stack.metrics_url("replica"), timeout=10).text)
    return (metric_value(samples, "sluice_engine_step_duration_seconds_sum") or 0.0,
            metric_value(samples, "sluice_engine_step_duration_seconds_count") or 0.0,
            metric_value(samples, "sluice_engine_step_tokens_total", kind="decode") or 0.0)


def stack_round(model_dir: Path, log_dir: Path, prompts: list[str], py_spy_dir: Path | None,
                env: dict[str, str]) -> dict:
    stack = LocalStack(model_dir=model_dir, log_dir=log_dir, ports=StackPorts.ephemeral(), cwd=log_dir,
                       extra_env=env)
    stack.start()
    try:
        stack.wait_ready(timeout_s=180)
        asyncio.run(drive(stack.gateway_url, stack.api_key, prompts[:CONCURRENCY // 4]))  # warm-up, not counted
        pids = {name: process.pid for name, process in stack.processes.items()}
        recorders = start_py_spy(pids, py_spy_dir) if py_spy_dir else {}
        cpu_before = {name: process_cpu_s(pid) for name, pid in pids.items()}
        client_before, engine_before = self_cpu_s(), engine_counters(stack)
        waits = CoreWaits(pids | {"load client": os.getpid()})
        load = asyncio.run(drive(stack.gateway_url, stack.api_key, prompts))
        core_waits = waits.read()
        cpu = {name: process_cpu_s(pid) - cpu_before[name] for name, pid in pids.items()}
        cpu["load client"] = self_cpu_s() - client_before
        engine_after = engine_counters(stack)
        stop_py_spy(recorders)
    finally:
        stack.stop()
    steps = engine_after[1] - engine_before[1]
    per_1k = {name: 1000 * seconds / max(load.output_tokens, 1) for name, seconds in cpu.items()}
    return {
        "output_tokens": load.output_tokens, "wall_s": load.wall_s, "errors": load.errors,
        "output_tokens_per_s": load.output_tokens / load.wall_s,
        "ttft_p99_ms": 1000 * statistics.quantiles(load.ttft_s, n=100)[98] if len(load.ttft_s) > 1 else None,
        "tpot_median_ms": 1000 * statistics.median(load.tpot_s) if load.tpot_s else None,
        "cpu_s": cpu, "cpu_s_per_1k_output_tokens": per_1k,
        "engine_mean_step_ms": 1000 * (engine_after[0] - engine_before[0]) / max(steps, 1),
        "engine_decode_tokens_per_step": (engine_after[2] - engine_before[2]) / max(steps, 1),
        "engine_steps": steps,
        "core_waits": core_waits,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=MODEL_DIR)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--py-spy", action="store_true", help="profile each process with py-spy (last round)")
    parser.add_argument("--profiles-dir", type=Path, help="keep py-spy's raw stacks here (one file per process)")
    parser.add_argument("--top", type=int, default=12, help="functions to print per process")
    parser.add_argument("--json", type=Path, help="write the figures (and profiles) here")
    parser.add_argument("--no-engine-alone", action="store_true", help="skip the engine-alone comparison")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for every service (repeatable), to compare settings")
    args = parser.parse_args()
    model_dir = args.model_dir.resolve()
    maker = PromptMaker(model_dir)
    prompts = [maker.text(PROMPT_TOKENS - 16) for _ in range(REQUESTS)]  # ~16 tokens of chat template
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores); {CONCURRENCY} streams, {REQUESTS} requests, "
          f"~{PROMPT_TOKENS} prompt / {OUTPUT_TOKENS} output tokens", flush=True)
    rounds, profiles = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(args.rounds):
            spy_dir = (args.profiles_dir or Path(tmp) / "py-spy") if args.py_spy and index == args.rounds - 1 else None
            if spy_dir:
                spy_dir.mkdir(parents=True, exist_ok=True)
            result = stack_round(model_dir, Path(tmp) / f"round-{index}", prompts, spy_dir,
                                 dict(item.split("=", 1) for item in args.env))
            rounds.append(result)
            per_1k = ", ".join(f"{name} {value:.2f}" for name, value in result["cpu_s_per_1k_output_tokens"].items())
            print(f"round {index + 1}: {result['output_tokens_per_s']:,.0f} output tok/s, p99 TTFT "
                  f"{result['ttft_p99_ms']:.0f} ms, TPOT median {result['tpot_median_ms']:.1f} ms, errors "
                  f"{result['errors']}; engine step {result['engine_mean_step_ms']:.1f} ms for "
                  f"{result['engine_decode_tokens_per_step']:.1f} decode tokens", flush=True)
            print(f"  CPU s per 1,000 output tokens: {per_1k}", flush=True)
            print_core_waits(result["core_waits"])
            if spy_dir:
                for name in sorted(p.stem for p in spy_dir.glob("*.txt")):
                    profiles[name] = summarise_py_spy(spy_dir / f"{name}.txt", args.top)
                    print_py_spy(name, profiles[name])
    token_prompts = [maker._tokenizer.encode(p).ids[:PROMPT_TOKENS] for p in prompts]
    alone = engine_alone(model_dir, token_prompts) if not args.no_engine_alone else None
    in_stack = statistics.median(r["engine_mean_step_ms"] for r in rounds)
    if alone:
            print(f"engine alone (same requests, no services): {alone['output_tokens_per_s']:,.0f} output tok/s, "
              f"step {alone['mean_step_ms']:.1f} ms for {alone['tokens_per_step']:.1f} tokens; in the stack "
              f"{in_stack:.1f} ms per step: {in_stack / alone['mean_step_ms']:.2f}x")
    medians = {name: statistics.median(r["cpu_s_per_1k_output_tokens"][name] for r in rounds)
               for name in rounds[0]["cpu_s_per_1k_output_tokens"]}
    print("median CPU s per 1,000 output tokens: " + ", ".join(f"{n} {v:.2f}" for n, v in medians.items()))
    floor = linear_floor(model_dir)
    others = sum(v for n, v in medians.items() if n != "replica")
    cores = os.cpu_count() or 1
    top = ceiling(floor, others, cores)
    served = statistics.median(r["output_tokens_per_s"] for r in rounds)
    print(f"floor: the model's linears alone, one thread, {floor['gflop_per_s']:.0f} GFLOP/s: "
          f"{floor['cpu_s_per_1k_output_tokens']:.2f} CPU s per 1,000 output tokens (LM head "
          f"{floor['lm_head_share']:.0%}), against the replica's {medians['replica']:.2f}")
    print(f"ceiling on {cores} cores with the others' {others:.2f}: {top:,.0f} output tok/s; the stack served "
          f"{served:,.0f} ({served / top:.0%} of it)")
    document = {"bench": "stack_profile", "cpu": cpu_model(), "rounds": rounds, "engine_alone": alone,
                "cpu_s_per_1k_output_tokens_median": medians, "linear_floor": floor,
                "ceiling_output_tokens_per_s": top, "py_spy": profiles}
    if args.json:
        args.json.write_text(json.dumps(document, indent=2))
    print(json.dumps({k: v for k, v in document.items() if k != "py_spy"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
