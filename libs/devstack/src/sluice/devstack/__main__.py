"""python -m sluice.devstack: the four services on localhost (`make run`).

--replicas N starts N replica processes (gRPC on 50061, 50062, ...; metrics
on 9061, 9062, ...), all watched by the one scheduler."""

import argparse
import signal
import sys
import threading
from pathlib import Path

from sluice.devstack.stack import LocalStack, StackPorts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", type=Path, default=Path(".sluice/models/tiny-llama"))
    parser.add_argument("--log-dir", type=Path, default=Path(".sluice/logs"))
    parser.add_argument("--api-key", default="sk-sluice-dev")
    parser.add_argument("--replicas", type=int, default=1, help="replica processes (default 1)")
    args = parser.parse_args()
    if args.replicas < 1:
        parser.error("--replicas must be at least 1")

    stack = LocalStack(model_dir=args.model_dir.resolve(), log_dir=args.log_dir,
                       ports=StackPorts().with_replicas(args.replicas), api_key=args.api_key,
                       num_replicas=args.replicas)
    stopping = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    replicas = "replica" if args.replicas == 1 else f"{args.replicas} replicas"
    print(f"starting gateway, router, scheduler and {replicas} (logs in {args.log_dir}/) ...", flush=True)
    stack.start()
    try:
        stack.wait_ready(timeout_s=180)
    except (TimeoutError, RuntimeError) as error:
        print(f"failed to start: {error}", file=sys.stderr)
        stack.stop()
        return 1
    url = stack.gateway_url
    print(
        f"""
Sluice is up.
  endpoint : {url}/v1   (OpenAI-compatible)
  api key  : {args.api_key}
  model    : tiny-llama
  replicas : {", ".join(stack.replica_addresses)}

  curl -N {url}/v1/chat/completions \\
    -H "Authorization: Bearer {args.api_key}" -H "Content-Type: application/json" \\
    -d '{{"model": "tiny-llama", "stream": true, "max_tokens": 32,
         "messages": [{{"role": "user", "content": "Say hello"}}]}}'

Ctrl-C stops everything.""",
        flush=True,
    )
    while not stopping.is_set():
        stopping.wait(0.5)
        try:
            stack.check_alive()
        except RuntimeError as error:
            print(error, file=sys.stderr)
            break
    print("stopping ...", flush=True)
    codes = stack.stop()
    print("stopped:", ", ".join(f"{name}={code}" for name, code in codes.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
