"""A local Prometheus scraping a Sluice stack on loopback (`make observe`).

Writes a prometheus.yml that scrapes every service's /metrics (gateway on
its HTTP port, router, scheduler and replicas on their metrics ports) and
loads the generated rules, then runs Debian's `prometheus` on it in the
foreground until Ctrl-C. The defaults are `make run`'s ports (StackPorts in
libs/devstack). tests/integration/test_prometheus_scrape.py builds its
config with `scrape_config()` for its own ephemeral ports.

    python deploy/observability/prometheus_local.py            # :9090, make run's ports
    python deploy/observability/prometheus_local.py --replica-metrics 9061,9062
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from sluice.devstack.stack import StackPorts

LOCAL = StackPorts()  # make run's ports
REPO_ROOT = Path(__file__).resolve().parents[2]
RULES_FILE = REPO_ROOT / "deploy" / "helm" / "sluice" / "files" / "prometheus-rules.yaml"
DASHBOARDS_DIR = REPO_ROOT / "deploy" / "helm" / "sluice" / "dashboards"


@dataclass(frozen=True, slots=True)
class Targets:
    """host:port of each service's /metrics."""

    gateway: str = f"127.0.0.1:{LOCAL.gateway}"
    router: str = f"127.0.0.1:{LOCAL.router_metrics}"
    scheduler: str = f"127.0.0.1:{LOCAL.scheduler_metrics}"
    replicas: tuple[str, ...] = (f"127.0.0.1:{LOCAL.replica_metrics}",)


def scrape_config(targets: Targets, *, interval_s: float, rules_file: Path = RULES_FILE) -> dict:
    """A prometheus.yml: one job per service, the rules evaluated as often as
    scraped (so recording rules keep up with the dashboards)."""
    interval = f"{int(interval_s * 1000)}ms"
    jobs = {"gateway": [targets.gateway], "router": [targets.router], "scheduler": [targets.scheduler],
            "replica": list(targets.replicas)}
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": [str(rules_file)],
        "scrape_configs": [
            {"job_name": job, "metrics_path": "/metrics", "static_configs": [{"targets": hosts}]}
            for job, hosts in jobs.items()
        ],
    }


def prometheus_command(config_file: Path, storage_dir: Path, listen: str) -> list[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("prometheus is missing: run `make observability-tools` (Debian's prometheus package)")
    return [binary, f"--config.file={config_file}", f"--storage.tsdb.path={storage_dir}",
            f"--web.listen-address={listen}", "--log.level=warn"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", default="127.0.0.1:9090", help="Prometheus web address")
    parser.add_argument("--gateway", default=Targets().gateway)
    parser.add_argument("--router-metrics", default=Targets().router)
    parser.add_argument("--scheduler-metrics", default=Targets().scheduler)
    parser.add_argument("--replica-metrics", default=str(LOCAL.replica_metrics), help="comma-separated ports (or host:port) of the replicas")
    parser.add_argument("--interval-s", type=float, default=5.0, help="scrape and rule evaluation interval")
    parser.add_argument("--data-dir", type=Path, default=REPO_ROOT / ".sluice" / "prometheus")
    args = parser.parse_args(argv)

    replicas = tuple(r if ":" in r else f"127.0.0.1:{r}" for r in args.replica_metrics.split(","))
    targets = Targets(args.gateway, args.router_metrics, args.scheduler_metrics, replicas)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    config_file = args.data_dir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(scrape_config(targets, interval_s=args.interval_s), sort_keys=False))
    command = prometheus_command(config_file, args.data_dir / "data", args.listen)
    print(f"Prometheus on http://{args.listen} scraping {targets}; Ctrl-C stops it.\n"
          f"Grafana: add a Prometheus data source at http://{args.listen} and import {DASHBOARDS_DIR}/*.json",
          flush=True)
    os.execv(command[0], command)  # Prometheus in the foreground; Ctrl-C ends it, nothing is left running


if __name__ == "__main__":
    sys.exit(main())
