"""Whole stack vs vLLM's CPU server, one after the other in one sitting.

Both serve the same tiny checkpoint on this machine; the shared load client
(../shared/bench-peer/load.py: 64 concurrent streams, 128 prompt / 128
output tokens, greedy, ignore_eos) drives Sluice's gateway (all four
services, SSE) and then vLLM's OpenAI server. Prints output tok/s and p99
TTFT for both and the ratios (issue targets: tok/s ratio >= 1.0, p99 TTFT
no worse).

Needs the peer environment (PEER_DIR, default ~/peer) from
../shared/bench-peer/install.sh; without it, says so and exits 0.

    .venv/bin/python bench/peer_stack_vs_vllm.py [--rounds 1]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sluice.devstack.stack import LocalStack, StackPorts

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


def sluice_round(peer_python: Path, model_dir: Path, log_dir: Path) -> dict:
    stack = LocalStack(model_dir=model_dir, log_dir=log_dir, ports=StackPorts.ephemeral(), cwd=log_dir)
    stack.start()
    try:
        stack.wait_ready(timeout_s=180)
        return run_load(peer_python, stack.gateway_url, model_dir, stack.api_key, "sluice")
    finally:
        stack.stop()


def vllm_round(peer_dir: Path, peer_python: Path, model_dir: Path) -> dict:
    env = {**os.environ, "PEER_DIR": str(peer_dir), "PORT": "8011"}
    # serve_vllm.sh serves ${PEER_DIR}/tiny-llama: point it at the same checkpoint Sluice serves.
    link = peer_dir / "tiny-llama"
    if link.is_symlink() or not link.exists():
        link.unlink(missing_ok=True)
        link.symlink_to(model_dir)
    subprocess.run(["bash", str(BENCH_PEER / "serve_vllm.sh")], env=env, check=True, timeout=900)
    try:
        return run_load(peer_python, "http://127.0.0.1:8011", model_dir, "", "vllm")
    finally:
        subprocess.run(["bash", str(BENCH_PEER / "stop_vllm.sh")], env=env, timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", type=Path, default=ROOT / ".sluice/models/tiny-llama")
    parser.add_argument("--peer-dir", type=Path, default=Path(os.environ.get("PEER_DIR", Path.home() / "peer")))
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    peer_python = args.peer_dir / "venv" / "bin" / "python"
    if not peer_python.exists():
        print(f"no peer environment at {args.peer_dir} (run ../shared/bench-peer/install.sh); skipping")
        return 0
    model_dir = args.model_dir.resolve()
    results: dict[str, list[dict]] = {"sluice": [], "vllm": []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            results["sluice"].append(sluice_round(peer_python, model_dir, Path(tmp) / f"sluice-{round_index}"))
            results["vllm"].append(vllm_round(args.peer_dir, peer_python, model_dir))
    best = {name: max(runs, key=lambda r: r["output_tok_per_s"]) for name, runs in results.items()}
    s, v = best["sluice"], best["vllm"]
    tok_ratio = s["output_tok_per_s"] / v["output_tok_per_s"]
    ttft_ratio = s["ttft_ms"]["p99"] / v["ttft_ms"]["p99"]
    print(f"sluice: {s['output_tok_per_s']:,.0f} output tok/s, TTFT p99 {s['ttft_ms']['p99']:.0f} ms, "
          f"TPOT median {s['tpot_ms']['median']:.1f} ms, errors {s['errors']}")
    print(f"vllm  : {v['output_tok_per_s']:,.0f} output tok/s, TTFT p99 {v['ttft_ms']['p99']:.0f} ms, "
          f"TPOT median {v['tpot_ms']['median']:.1f} ms, errors {v['errors']}")
    for name, runs in results.items():
        print(f"{name} rounds: " + ", ".join(
            f"{r['output_tok_per_s']:,.0f} tok/s / p99 TTFT {r['ttft_ms']['p99']:.0f} ms" for r in runs))
    print(f"ratio sluice / vllm: throughput {tok_ratio:.2f}x (target >= 1.0), p99 TTFT {ttft_ratio:.2f}x (target <= 1.0)")
    print(json.dumps({"bench": "stack_vs_vllm", "throughput_ratio": round(tok_ratio, 3),
                      "p99_ttft_ratio": round(ttft_ratio, 3), "sluice": s, "vllm": v}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
