"""python -m sluice.devstack: the four services on localhost (`make run`).

--replicas N starts N replica processes (gRPC on 50061, 50062, ...; metrics
on 9061, 9062, ...), all watched by the one scheduler.

--catalog two-versions serves the alias tiny-llama by two versions,
tiny-llama-v1 (--model-dir) and tiny-llama-v2 (--small-model-dir, the
2-layer model with the same tokenizer), one replica each at least, at
--weights (default 90,10). The router reads the catalog from
--catalog-file and applies edits to its weights within seconds, without a
restart (python -m sluice.devstack.weights rewrites them)."""

import argparse
import signal
import sys
import threading
from pathlib import Path

from sluice.devstack.catalog import LocalCatalog, two_versions
from sluice.devstack.stack import LocalStack, StackPorts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", type=Path, default=Path(".sluice/models/tiny-llama"))
    parser.add_argument("--log-dir", type=Path, default=Path(".sluice/logs"))
    parser.add_argument("--api-key", default="sk-sluice-dev")
    parser.add_argument("--replicas", type=int, default=None,
                        help="replica processes (default 1, or one per catalog version)")
    parser.add_argument("--catalog", choices=["one-version", "two-versions"], default="one-version",
                        help="what the router serves (default one-version: --model-dir alone)")
    parser.add_argument("--small-model-dir", type=Path, default=Path(".sluice/models/tiny-llama-small"),
                        help="tiny-llama-v2's model (two-versions)")
    parser.add_argument("--weights", type=_weights, default=(90, 10), help="v1,v2 weights (two-versions; default 90,10)")
    parser.add_argument("--catalog-file", type=Path, default=Path(".sluice/catalog.json"),
                        help="where the router's catalog is written (two-versions)")
    args = parser.parse_args()
    catalog = None
    if args.catalog == "two-versions":
        try:
            catalog = two_versions(args.model_dir.resolve(), args.small_model_dir.resolve(), args.weights)
        except ValueError as error:
            parser.error(str(error))
    replicas = args.replicas if args.replicas is not None else len(catalog.versions) if catalog else 1
    if replicas < (len(catalog.versions) if catalog else 1):
        parser.error(f"--replicas must be at least {len(catalog.versions) if catalog else 1}")

    stack = LocalStack(model_dir=args.model_dir.resolve(), log_dir=args.log_dir,
                       ports=StackPorts().with_replicas(replicas), api_key=args.api_key,
                       num_replicas=replicas, catalog=catalog, catalog_path=args.catalog_file.resolve())
    stopping = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    print(f"starting gateway, router, scheduler and {'replica' if replicas == 1 else f'{replicas} replicas'} "
          f"(logs in {args.log_dir}/) ...", flush=True)
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
{_catalog_help(stack, catalog) if catalog is not None else ""}
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


def _weights(text: str) -> tuple[int, int]:
    try:
        v1, v2 = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"weights are two integers, v1,v2 (e.g. 90,10), not {text!r}") from None
    return v1, v2


def _catalog_help(stack: LocalStack, catalog: LocalCatalog) -> str:
    def replicas_of(version: str) -> str:
        return ", ".join(address for i, address in enumerate(stack.replica_addresses)
                         if stack.replica_version(i).version == version)
    served = "\n".join(f"    {v.version:<14} weight {v.weight:>3}  {v.model_dir}  (replicas {replicas_of(v.version)})"
                       for v in catalog.versions)
    names = " ".join(f"{v.version}={w}" for v, w in zip(catalog.versions, (0, 100)))
    interval_s = stack.environment("router").get("SLUICE_CATALOG_RELOAD_INTERVAL_S", "2")  # the router's default
    return f"""
  catalog  : {stack.models_file}   (SLUICE_MODELS_FILE of the router)
  alias {catalog.alias}:
{served}

  The router re-reads the catalog every SLUICE_CATALOG_RELOAD_INTERVAL_S ({interval_s} s)
  and applies new weights without a restart; in-flight streams finish where
  they started. Edit the file's "weight" fields, or:

    .venv/bin/python -m sluice.devstack.weights {stack.models_file} {names}

  Each response's system_fingerprint names the version that served it.
"""


if __name__ == "__main__":
    sys.exit(main())
