"""Write the generated observability files into the Helm chart.

    python deploy/observability/generate.py           # rewrite them
    python deploy/observability/generate.py --check   # exit 1 if any is stale

Outputs (checked in; tests/deploy/test_observability.py fails on drift):
  deploy/helm/sluice/dashboards/<uid>.json     from dashboards.py
  deploy/helm/sluice/files/prometheus-rules.yaml from rules.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml
from grafanalib._gen import DashboardEncoder

import dashboards
import rules

CHART_DIR = Path(__file__).resolve().parents[1] / "helm" / "sluice"
DASHBOARDS_DIR = CHART_DIR / "dashboards"
RULES_FILE = CHART_DIR / "files" / "prometheus-rules.yaml"

RULES_HEADER = """\
# GENERATED FILE - do not edit. Written by deploy/observability/generate.py
# from deploy/observability/rules.py; CI fails when it drifts. runbook_url is
# relative to the repository; the chart prefixes observability.runbookBaseUrl.
"""


class _BlockStrings(yaml.SafeDumper):
    """Multi-line PromQL as YAML block literals, so the file reads like PromQL."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockStrings.add_representer(str, _represent_str)


def rules_text() -> str:
    return RULES_HEADER + yaml.dump(rules.rule_groups(), Dumper=_BlockStrings, sort_keys=False, width=200)


def dashboard_text(spec: dashboards.DashboardSpec) -> str:
    data = dashboards.build(spec).to_json_data()
    return json.dumps(data, cls=DashboardEncoder, sort_keys=True, indent=2) + "\n"


def outputs() -> dict[Path, str]:
    files = {DASHBOARDS_DIR / f"{spec.uid}.json": dashboard_text(spec) for spec in dashboards.DASHBOARDS}
    files[RULES_FILE] = rules_text()
    return files


def stale(files: dict[Path, str]) -> list[Path]:
    expected = set(files)
    extra = set(DASHBOARDS_DIR.glob("*.json")) - expected  # a dashboard that was removed from the generator
    return sorted(p for p in expected if not p.exists() or p.read_text() != files[p]) + sorted(extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    files = outputs()
    if args.check:
        for path in stale(files):
            print(f"{path} is stale: run `python deploy/observability/generate.py`", file=sys.stderr)
        return 1 if stale(files) else 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
