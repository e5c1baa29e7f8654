"""A real Prometheus (Debian's `prometheus`, from `make observability-tools`)
on a loopback port, scraping a running LocalStack with the config of
deploy/observability/prometheus_local.py (the one `make observe` uses)."""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import yaml

from sluice.devstack.stack import LocalStack, free_port

OBSERVABILITY_DIR = Path(__file__).resolve().parents[2] / "deploy" / "observability"
READY_TIMEOUT_S = 30.0


def load_observability_module(name: str) -> ModuleType:
    """deploy/observability/<name>.py (scripts, not a package) as a module."""
    path = OBSERVABILITY_DIR / f"{name}.py"
    if str(OBSERVABILITY_DIR) not in sys.path:
        sys.path.insert(0, str(OBSERVABILITY_DIR))  # they import each other by file name
    module_name = f"sluice_observability_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up while decorating
    spec.loader.exec_module(module)
    return module


prometheus_local = load_observability_module("prometheus_local")


@contextlib.contextmanager
def running_prometheus(stack: LocalStack, directory: Path, scrape_interval_s: float) -> Iterator[str]:
    """Yields the base URL once Prometheus answers /-/ready; stops it after."""
    assert shutil.which("prometheus"), "prometheus is missing: run `make observability-tools`"
    ports = stack.ports
    targets = prometheus_local.Targets(
        gateway=f"127.0.0.1:{ports.gateway}", router=f"127.0.0.1:{ports.router_metrics}",
        scheduler=f"127.0.0.1:{ports.scheduler_metrics}",
        replicas=tuple(f"127.0.0.1:{ports.replica_metrics_port(i)}" for i in range(stack.num_replicas)),
    )
    config = directory / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_local.scrape_config(targets, interval_s=scrape_interval_s)))
    url = f"http://127.0.0.1:{free_port()}"
    log_path = directory / "prometheus.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            prometheus_local.prometheus_command(config, directory / "data", url.removeprefix("http://")),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while True:
                assert process.poll() is None, log_path.read_text()
                try:
                    if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "prometheus did not get ready"
                time.sleep(0.2)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
