"""Start gateway, router, scheduler and N replicas as child processes.

Each service is its own process with its own environment, exactly as in a
deployment; only the addresses are loopback. Logs go to one file per
process so a failing test can show them.

Replica i (0-based) is the process `replica_name(i)`: "replica" for the
first (so one-replica stacks look as they always did), "replica-1", ...
after it; its replica id is "replica-<i>", its ports `ports.replica_port(i)`
and `ports.replica_metrics_port(i)`, its log `<log_dir>/<name>.log`.

With a `catalog` (sluice.devstack.catalog), the router reads it from
`models_file` (written at start) and replica i serves version
`catalog.versions[i % len(versions)]`: one replica per version at least.
Without one, every process serves SLUICE_MODEL_DIR as the one version.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from sluice.devstack.catalog import CatalogVersion, LocalCatalog

SERVICES = ("replica", "scheduler", "router", "gateway")


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports (all held open until all are picked)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            sockets.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def replica_name(index: int) -> str:
    """Process, log and metrics name of replica `index`."""
    return "replica" if index == 0 else f"replica-{index}"


@dataclass(frozen=True, slots=True)
class StackPorts:
    gateway: int = 8000
    router: int = 50051
    scheduler: int = 50052
    replica: int = 50061
    router_metrics: int = 9051
    scheduler_metrics: int = 9052
    replica_metrics: int = 9061
    # Replicas after the first: (gRPC port, metrics port) of replica 1, 2, ...
    more_replicas: tuple[tuple[int, int], ...] = ()

    @classmethod
    def ephemeral(cls, num_replicas: int = 1) -> "StackPorts":
        ports = free_ports(7 + 2 * (num_replicas - 1))
        return cls(*ports[:7], more_replicas=tuple(zip(ports[7::2], ports[8::2])))

    def with_replicas(self, num_replicas: int) -> "StackPorts":
        """These ports for `num_replicas`: ports already given are kept, the
        rest count up from the first replica's (50062/9062, 50063/9063, ...)."""
        more = list(self.more_replicas[: num_replicas - 1])
        for index in range(len(more) + 1, num_replicas):
            more.append((self.replica + index, self.replica_metrics + index))
        return replace(self, more_replicas=tuple(more))

    @property
    def num_replicas(self) -> int:
        return 1 + len(self.more_replicas)

    def replica_port(self, index: int) -> int:
        return self.replica if index == 0 else self.more_replicas[index - 1][0]

    def replica_metrics_port(self, index: int) -> int:
        return self.replica_metrics if index == 0 else self.more_replicas[index - 1][1]


@dataclass
class LocalStack:
    model_dir: Path
    log_dir: Path
    ports: StackPorts = field(default_factory=StackPorts)
    api_key: str = "sk-sluice-dev"
    extra_env: dict[str, str] = field(default_factory=dict)  # every process
    python: str = sys.executable
    services: tuple[str, ...] = SERVICES  # a subset leaves the rest out (e.g. no replica)
    cwd: Path | None = None  # where embedded defaults (.sluice/ledger.db) land
    num_replicas: int = 1
    # Replica index -> env for that replica alone, over extra_env (e.g. a
    # different SLUICE_KV_CACHE_BLOCKS for one of them).
    replica_env: dict[int, dict[str, str]] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)  # by process name, in start order
    # Several versions behind the router's catalog file; None = the one
    # model_dir version. `catalog_path` None = <log_dir>/models.json.
    catalog: LocalCatalog | None = None
    catalog_path: Path | None = None

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError(f"num_replicas must be at least 1, got {self.num_replicas}")
        if self.catalog is not None and self.num_replicas < len(self.catalog.versions):
            raise ValueError(f"a catalog of {len(self.catalog.versions)} versions needs as many replicas at least, "
                             f"got num_replicas={self.num_replicas}")
        unknown = set(self.replica_env) - set(range(self.num_replicas))
        if unknown:
            raise ValueError(f"replica_env names replicas {sorted(unknown)} of a {self.num_replicas}-replica stack")
        missing = self.num_replicas - self.ports.num_replicas
        if missing > 0:  # ports for the extra replicas were not given: any free ones
            ports = free_ports(2 * missing)
            more = self.ports.more_replicas + tuple(zip(ports[::2], ports[1::2]))
            self.ports = replace(self.ports, more_replicas=more)

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.gateway}"

    @property
    def replica_addresses(self) -> list[str]:
        return [f"127.0.0.1:{self.ports.replica_port(i)}" for i in range(self.num_replicas)]

    @property
    def replica_ids(self) -> list[str]:
        return [f"replica-{i}" for i in range(self.num_replicas)]

    @property
    def models_file(self) -> Path:
        """Where the router reads the catalog (with a `catalog`)."""
        return self.catalog_path if self.catalog_path is not None else self.log_dir / "models.json"

    def replica_version(self, index: int) -> CatalogVersion | None:
        """The catalog version replica `index` serves; None without a catalog."""
        if self.catalog is None:
            return None
        return self.catalog.versions[index % len(self.catalog.versions)]

    def write_catalog(self, catalog: LocalCatalog) -> None:
        """Replace the router's catalog (new weights, say) while it runs; the
        replicas stay as they are, so the versions must be the started ones."""
        if self.catalog is not None and {v.version for v in catalog.versions} - {
                v.version for v in self.catalog.versions}:
            raise ValueError("the new catalog names a version no replica of this stack serves")
        self.catalog = catalog
        catalog.write(self.models_file)

    def metrics_url(self, service: str, index: int = 0) -> str:
        """/metrics of "router", "scheduler" or "replica" (replica `index`)."""
        p = self.ports
        port = {"router": p.router_metrics, "scheduler": p.scheduler_metrics,
                "replica": p.replica_metrics_port(index)}[service]
        return f"http://127.0.0.1:{port}/metrics"

    def environment(self, service: str, index: int = 0) -> dict[str, str]:
        """The environment of `service` (replica `index` for "replica")."""
        p = self.ports
        env = {
            **os.environ,
            "SLUICE_MODEL_DIR": str(self.model_dir),
            "SLUICE_ROUTER_ADDRESS": f"127.0.0.1:{p.router}",
            "SLUICE_SCHEDULER_ADDRESS": f"127.0.0.1:{p.scheduler}",
            "SLUICE_REPLICA_ADDRESS": self.replica_addresses[0],
            "SLUICE_REPLICA_ADDRESSES": ",".join(self.replica_addresses),
            "SLUICE_GATEWAY_PORT": str(p.gateway),
            "SLUICE_DEV_API_KEY": self.api_key,
            "SLUICE_SHUTDOWN_GRACE_S": "2",
            **self.extra_env,
        }
        metrics = {"router": p.router_metrics, "scheduler": p.scheduler_metrics}
        if service in metrics:
            env["SLUICE_METRICS_PORT"] = str(metrics[service])
        if service == "router" and self.catalog is not None:
            env["SLUICE_MODELS_FILE"] = str(self.models_file)
        if service == "replica":
            env["SLUICE_REPLICA_ADDRESS"] = self.replica_addresses[index]
            env["SLUICE_REPLICA_ID"] = self.replica_ids[index]
            env["SLUICE_METRICS_PORT"] = str(p.replica_metrics_port(index))
            version = self.replica_version(index)
            if version is not None:
                env["SLUICE_MODEL_NAME"] = self.catalog.alias
                env["SLUICE_MODEL_VERSION"] = version.version
                env["SLUICE_MODEL_DIR"] = str(version.model_dir)
            env.update(self.replica_env.get(index, {}))
        return env

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.catalog is not None:
            self.catalog.write(self.models_file)
        for service in self.services:
            if service == "replica":
                for index in range(self.num_replicas):
                    self._spawn(replica_name(index), service, self.environment(service, index))
            else:
                self._spawn(service, service, self.environment(service))

    @contextlib.contextmanager
    def running(self, timeout_s: float = 180.0) -> Iterator["LocalStack"]:
        """Started and ready within `timeout_s` for the body; stopped after it,
        however it ends (a stack that never got ready included)."""
        self.start()
        try:
            self.wait_ready(timeout_s=timeout_s)
            yield self
        finally:
            self.stop()

    def _spawn(self, name: str, service: str, env: dict[str, str]) -> None:
        log = open(self.log_dir / f"{name}.log", "wb")
        self.processes[name] = subprocess.Popen(
            [self.python, "-m", f"sluice.{service}"],
            env=env,
            cwd=self.cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, not them
        )
        log.close()

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Until the gateway is ready and the scheduler sees all replicas ready."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                self.check_alive()
                if self._ready(client):
                    return
                time.sleep(0.2)
        raise TimeoutError(f"stack not ready in {timeout_s}s; logs in {self.log_dir}")

    def wait_alive(self, timeout_s: float = 60.0) -> None:
        """Until the gateway answers /healthz (whatever is behind it)."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                self.check_alive()
                try:
                    if client.get(self.gateway_url + "/healthz").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        raise TimeoutError(f"gateway not up in {timeout_s}s; logs in {self.log_dir}")

    def _ready(self, client: httpx.Client) -> bool:
        try:
            if client.get(self.gateway_url + "/readyz/route").status_code != 200:
                return False
            scheduler = client.get(self.metrics_url("scheduler")).text
        except httpx.HTTPError:
            return False
        # The scheduler sees every replica ready (their canaries passed).
        return _metric(scheduler, "sluice_scheduler_replicas_ready") == self.num_replicas

    def check_alive(self) -> None:
        """Raise RuntimeError with the log tail if a service has exited."""
        for name, process in self.processes.items():
            if process.poll() is not None:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{tail}")

    def stop(self, timeout_s: float = 10.0) -> dict[str, int | None]:
        """SIGTERM everything (front to back), then SIGKILL what is left.
        Exit codes by process name."""
        for process in reversed(self.processes.values()):  # started back to front
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        codes = {}
        for name, process in self.processes.items():
            try:
                codes[name] = process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.kill()
                codes[name] = process.wait()
        return codes

    def log(self, service: str, index: int = 0) -> str:
        name = replica_name(index) if service == "replica" else service
        return (self.log_dir / f"{name}.log").read_text(errors="replace")


def _metric(text: str, name: str) -> float | None:
    """The value of the first sample of `name` in a Prometheus text page."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None
