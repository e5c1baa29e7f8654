"""Whole stack vs vLLM's CPU server, one after the other in one sitting.

Both serve the same tiny checkpoint on this machine; the shared load client
(../shared/bench-peer/load.py: 64 concurrent streams, 128 prompt / 128
output tokens, greedy, ignore_eos) drives Sluice's gateway (all four
services, SSE) and then vLLM's OpenAI server. Prints output tok/s and p99
TTFT for both and the ratios (targets: tok/s ratio >= 1.5, p99 TTFT and
median TPOT no worse).

Needs the peer environment (PEER_DIR, default ~/peer) from
../shared/bench-peer/install.sh; without it, says so and exits 0. Every
round is printed; the ratios compare medians over the rounds (best-of is
noisy in both directions).

--tracing-overhead runs no vLLM: Sluice rounds alternate with tracing off
and on, in ABBA order (OpenTelemetry spans exported over OTLP/HTTP to a sink in this
process that accepts and counts them), and prints the ratio of median
output tok/s and p99 TTFT, on / off (target: within 5%). The load client
runs on the peer's Python when there is one, else on this one (it needs
httpx and transformers, both in the dev venv).

--cpu-isa avx2 runs both servers on the instruction sets of an AVX2-only
CPU, to measure that class of machine from a wider one: torch, MKL and
oneDNN capped by their environment variables, Sluice's native kernels by
SLUICE_CPU_ISA, and vLLM's own kernels by having its processes load the
build it ships for AVX2 CPUs (vLLM picks `_C_AVX2`, `_C_AVX512` or `_C`
from torch.cpu's hardware checks, which no variable changes: a
sitecustomize on vLLM's PYTHONPATH answers them as an AVX2 CPU would). Each
vLLM round prints which build its processes loaded.

    .venv/bin/python bench/peer_stack_vs_vllm.py [--rounds 3] [--tracing-overhead] [--cpu-isa avx2]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_harness import cpu_model  # noqa: E402

from sluice.devstack.stack import LocalStack, StackPorts  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BENCH_PEER = ROOT.parent / "shared" / "bench-peer"
LOAD_ARGS = ["--concurrency", "64", "--num-requests", "128", "--prompt-tokens", "128", "--output-tokens", "128"]


def run_load(peer_python: Path, url: str, model_dir: Path, api_key: str, label: str) -> dict:
    command = [str(peer_python), str(BENCH_PEER / "load.py"), "--url", url, "--model", "tiny-llama",
               "--tokenizer", str(model_dir), "--api-key", api_key, "--label", label, *LOAD_ARGS]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if result.returncode != 0:
        raise RuntimeError(f"load.py failed for {label}:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def sluice_round(peer_python: Path, model_dir: Path, log_dir: Path, env: dict[str, str] | None = None) -> dict:
    stack = LocalStack(model_dir=model_dir, log_dir=log_dir, ports=StackPorts.ephemeral(), cwd=log_dir,
                       extra_env=env or {})
    stack.start()
    try:
        stack.wait_ready(timeout_s=180)
        return run_load(peer_python, stack.gateway_url, model_dir, stack.api_key, "sluice")
    finally:
        stack.stop()


# vLLM's processes import this (as sitecustomize) under --cpu-isa avx2. It
# patches torch.cpu's hardware checks when torch.cpu is first imported,
# without importing torch itself earlier than vLLM would.
VLLM_AVX2_SITECUSTOMIZE = """\
import importlib.abc, importlib.machinery, sys

_HELD = ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_vnni_supported",
         "_is_amx_tile_supported", "_is_amx_fp16_supported")


class _HoldToAvx2(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch.cpu":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            for check in _HELD:
                if hasattr(module, check):
                    setattr(module, check, lambda: False)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _HoldToAvx2())
"""


def vllm_kernel_builds() -> list[str]:
    """The vLLM kernel libraries (_C*.so) that running processes have mapped."""
    builds: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # the process ended, or is not ours
            continue
        builds.update(Path(line.split()[-1]).name for line in text.splitlines()
                      if "/vllm/_C" in line and line.rstrip().endswith(".so"))
    return sorted(builds)


def vllm_round(peer_dir: Path, peer_python: Path, model_dir: Path, hold_avx2: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="vllm-site-") as site_dir:
        env = {**os.environ, "PEER_DIR": str(peer_dir), "PORT": "8011"}
        if hold_avx2:
            (Path(site_dir) / "sitecustomize.py").write_text(VLLM_AVX2_SITECUSTOMIZE)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [site_dir, env.get("PYTHONPATH", "")]))
        return _vllm_round(peer_dir, peer_python, model_dir, env)


def _vllm_round(peer_dir: Path, peer_python: Path, model_dir: Path, env: dict[str, str]) -> dict:
    # serve_vllm.sh serves ${PEER_DIR}/tiny-llama: point it at the same checkpoint Sluice serves.
    link = peer_dir / "tiny-llama"
    if link.is_symlink() or not link.exists():
        link.unlink(missing_ok=True)
        link.symlink_to(model_dir)
    subprocess.run(["bash", str(BENCH_PEER / "serve_vllm.sh")], env=env, check=True, timeout=900)
    try:
        print(f"vLLM's kernel build: {', '.join(vllm_kernel_builds()) or 'none found'}", flush=True)
        return run_load(peer_python, "http://127.0.0.1:8011", model_dir, "", "vllm")
    finally:
        subprocess.run(["bash", str(BENCH_PEER / "stop_vllm.sh")], env=env, timeout=120)


class SpanSink:
    """An OTLP/HTTP endpoint on loopback that accepts every export (200) and
    counts requests and bytes: the exporter's whole cost, none of a collector's."""

    def __init__(self) -> None:
        sink = self
        self.requests = self.bytes = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                sink.requests += 1
                sink.bytes += len(body)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "SpanSink":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()


def describe(run: dict) -> str:
    return (f"{run['output_tok_per_s']:,.0f} tok/s, p99 TTFT {run['ttft_ms']['p99']:.0f} ms, "
            f"TPOT median {run['tpot_ms']['median']:.1f} ms, errors {run['errors']}")


def medians(runs: list[dict]) -> tuple[float, float, float]:
    return (statistics.median(r["output_tok_per_s"] for r in runs),
            statistics.median(r["ttft_ms"]["p99"] for r in runs),
            statistics.median(r["tpot_ms"]["median"] for r in runs))


def tracing_overhead(load_python: Path, model_dir: Path, rounds: int, sample_ratio: float) -> int:
    results: dict[str, list[dict]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp, SpanSink() as sink:
        # The SDK's standard sampler variables: every trace, or a share of
        # them (a request keeps its gateway's decision on every hop).
        sampler = ({"OTEL_TRACES_SAMPLER": "always_on"} if sample_ratio >= 1.0 else
                   {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": str(sample_ratio)})
        on_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint, **sampler}
        print(f"CPU: {cpu_model()} ({os.cpu_count()} cores); tracing on = {sampler}", flush=True)
        for index in range(rounds):
            # Off first in odd rounds, on first in even ones: the second run
            # of a pair ran measurably faster (page cache, clocks), which a
            # fixed order would credit to one side.
            pair = (("off", {}), ("on", on_env))
            for mode, env in pair if index % 2 == 0 else pair[::-1]:
                run = sluice_round(load_python, model_dir, Path(tmp) / f"{mode}-{index}", env)
                results[mode].append(run)
                print(f"round {index + 1} tracing {mode:3}: {describe(run)}", flush=True)
    off, on = medians(results["off"]), medians(results["on"])
    tok_ratio, ttft_ratio = on[0] / off[0], on[1] / off[1]
    print(f"medians: tracing off {off[0]:,.0f} tok/s, p99 TTFT {off[1]:.0f} ms; "
          f"on {on[0]:,.0f} tok/s, p99 TTFT {on[1]:.0f} ms; spans exported in {sink.requests} requests, "
          f"{sink.bytes / 1e6:.1f} MB")
    print(f"ratio tracing on / off: throughput {tok_ratio:.3f}x, p99 TTFT {ttft_ratio:.3f}x (target: within 5%)")
    print(json.dumps({"bench": "stack_tracing_overhead", "throughput_ratio": round(tok_ratio, 3),
                      "p99_ttft_ratio": round(ttft_ratio, 3), "rounds": rounds, "sample_ratio": sample_ratio,
                      "off": results["off"], "on": results["on"], "export_requests": sink.requests}))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", type=Path, default=ROOT / ".sluice/models/tiny-llama")
    parser.add_argument("--peer-dir", type=Path, default=Path(os.environ.get("PEER_DIR", Path.home() / "peer")))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tracing-overhead", action="store_true",
                        help="no vLLM: Sluice with tracing off and on, alternating rounds")
    parser.add_argument("--trace-sample-ratio", type=float, default=1.0,
                        help="with --tracing-overhead: the share of requests traced (default 1: all)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="set in every Sluice service's environment (repeatable), e.g. SLUICE_TORCH_THREADS=1")
    parser.add_argument("--cpu-isa", choices=["auto", "avx2"], default="auto",
                        help="avx2: both servers' torch, MKL and oneDNN held to AVX2 (ATEN_CPU_CAPABILITY, "
                        "MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA), Sluice's native kernels "
                        "(SLUICE_CPU_ISA) and vLLM's (its AVX2 build): an AVX2-only CPU's code paths")
    args = parser.parse_args()
    sluice_env = dict(item.split("=", 1) for item in args.env)
    if args.cpu_isa == "avx2":
        # Both servers inherit these. MKL too: torch's float32 matmuls on an
        # Intel CPU go to MKL, which picks AVX-512 unless told otherwise.
        os.environ.update(ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2", ONEDNN_MAX_CPU_ISA="AVX2")
        sluice_env["SLUICE_CPU_ISA"] = "avx2"
    peer_python = args.peer_dir / "venv" / "bin" / "python"
    model_dir = args.model_dir.resolve()
    if not (BENCH_PEER / "load.py").exists():
        print(f"no load client at {BENCH_PEER / 'load.py'}; skipping")
        return 0
    if args.tracing_overhead:
        return tracing_overhead(peer_python if peer_python.exists() else Path(sys.executable), model_dir,
                                args.rounds, args.trace_sample_ratio)
    if not peer_python.exists():
        print(f"no peer environment at {args.peer_dir} (run ../shared/bench-peer/install.sh); skipping")
        return 0
    results: dict[str, list[dict]] = {"sluice": [], "vllm": []}
    held = ("; both held to AVX2 (ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA; "
            "vLLM's own kernels: its AVX2 build)"
            if args.cpu_isa == "avx2" else "")
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores); Sluice's extra environment: {sluice_env or 'none'}{held}",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            results["sluice"].append(sluice_round(peer_python, model_dir, Path(tmp) / f"sluice-{round_index}",
                                                  sluice_env))
            print(f"round {round_index + 1} sluice: {describe(results['sluice'][-1])}", flush=True)
            results["vllm"].append(vllm_round(args.peer_dir, peer_python, model_dir, args.cpu_isa == "avx2"))
            print(f"round {round_index + 1} vllm  : {describe(results['vllm'][-1])}", flush=True)
    s, v = medians(results["sluice"]), medians(results["vllm"])
    tok_ratio, ttft_ratio, tpot_ratio = s[0] / v[0], s[1] / v[1], s[2] / v[2]
    print(f"medians over {args.rounds} rounds: sluice {s[0]:,.0f} tok/s, p99 TTFT {s[1]:.0f} ms, TPOT {s[2]:.1f} ms; "
          f"vllm {v[0]:,.0f} tok/s, p99 TTFT {v[1]:.0f} ms, TPOT {v[2]:.1f} ms")
    print(f"ratio sluice / vllm (medians): throughput {tok_ratio:.2f}x, p99 TTFT {ttft_ratio:.2f}x, "
          f"TPOT {tpot_ratio:.2f}x")
    print(json.dumps({"bench": "stack_vs_vllm", "cpu": cpu_model(), "cpu_isa": args.cpu_isa,
                      "throughput_ratio": round(tok_ratio, 3),
                      "p99_ttft_ratio": round(ttft_ratio, 3), "tpot_ratio": round(tpot_ratio, 3),
                      "rounds": args.rounds, "sluice": results["sluice"], "vllm": results["vllm"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
