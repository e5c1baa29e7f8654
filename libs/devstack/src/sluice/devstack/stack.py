"""Start gateway, router, scheduler and replica as child processes.

Each service is its own process with its own environment, exactly as in a
deployment; only the addresses are loopback. Logs go to one file per
service so a failing test can show them.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

SERVICES = ("replica", "scheduler", "router", "gateway")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True, slots=True)
class StackPorts:
    gateway: int = 8000
    router: int = 50051
    scheduler: int = 50052
    replica: int = 50061
    router_metrics: int = 9051
    scheduler_metrics: int = 9052
    replica_metrics: int = 9061

    @classmethod
    def ephemeral(cls) -> "StackPorts":
        return cls(*(free_port() for _ in range(7)))


@dataclass
class LocalStack:
    model_dir: Path
    log_dir: Path
    ports: StackPorts = field(default_factory=StackPorts)
    api_key: str = "sk-sluice-dev"
    extra_env: dict[str, str] = field(default_factory=dict)
    python: str = sys.executable
    services: tuple[str, ...] = SERVICES  # a subset leaves the rest out (e.g. no replica)
    cwd: Path | None = None  # where embedded defaults (.sluice/ledger.db) land
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.gateway}"

    def metrics_url(self, service: str) -> str:
        port = {"router": self.ports.router_metrics, "scheduler": self.ports.scheduler_metrics,
                "replica": self.ports.replica_metrics}[service]
        return f"http://127.0.0.1:{port}/metrics"

    def environment(self, service: str) -> dict[str, str]:
        p = self.ports
        env = {
            **os.environ,
            "SLUICE_MODEL_DIR": str(self.model_dir),
            "SLUICE_ROUTER_ADDRESS": f"127.0.0.1:{p.router}",
            "SLUICE_SCHEDULER_ADDRESS": f"127.0.0.1:{p.scheduler}",
            "SLUICE_REPLICA_ADDRESS": f"127.0.0.1:{p.replica}",
            "SLUICE_REPLICA_ADDRESSES": f"127.0.0.1:{p.replica}",
            "SLUICE_GATEWAY_PORT": str(p.gateway),
            "SLUICE_DEV_API_KEY": self.api_key,
            "SLUICE_SHUTDOWN_GRACE_S": "2",
            **self.extra_env,
        }
        metrics = {"router": p.router_metrics, "scheduler": p.scheduler_metrics, "replica": p.replica_metrics}
        if service in metrics:
            env["SLUICE_METRICS_PORT"] = str(metrics[service])
        return env

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for service in self.services:
            log = open(self.log_dir / f"{service}.log", "wb")
            self.processes[service] = subprocess.Popen(
                [self.python, "-m", f"sluice.{service}"],
                env=self.environment(service),
                cwd=self.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in a terminal reaches us, not them
            )
            log.close()

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Until the gateway can route to a replica whose canary passed."""
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
            if client.get(self.gateway_url + "/readyz").status_code != 200:
                return False
            scheduler = client.get(self.metrics_url("scheduler")).text
        except httpx.HTTPError:
            return False
        # The scheduler sees every replica ready (their canaries passed).
        return _metric(scheduler, "sluice_scheduler_replicas_ready") == 1

    def check_alive(self) -> None:
        """Raise RuntimeError with the log tail if a service has exited."""
        for service, process in self.processes.items():
            if process.poll() is not None:
                tail = (self.log_dir / f"{service}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{service} exited with {process.returncode}:\n{tail}")

    def stop(self, timeout_s: float = 10.0) -> dict[str, int | None]:
        """SIGTERM everything (front to back), then SIGKILL what is left."""
        for service in reversed(SERVICES):
            process = self.processes.get(service)
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        codes = {}
        for service, process in self.processes.items():
            try:
                codes[service] = process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.kill()
                codes[service] = process.wait()
        return codes

    def log(self, service: str) -> str:
        return (self.log_dir / f"{service}.log").read_text(errors="replace")


def _metric(text: str, name: str) -> float | None:
    """The value of the first sample of `name` in a Prometheus text page."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None
