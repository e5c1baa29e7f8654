"""Render the Sluice Helm chart to plain manifests, offline.

Uses the Helm Go SDK compiled into the `helm-python-sdk` wheel (ctypes over
libhelm_c; no helm binary, no cluster, no network). deploy/k8s/sluice.yaml
is the chart rendered with its default values; CI's drift check
(tests/deploy/test_chart_render.py) renders again and compares byte for byte.

    python deploy/render.py            # rewrite deploy/k8s/sluice.yaml
    python deploy/render.py --check    # exit 1 if deploy/k8s/sluice.yaml is stale
    python deploy/render.py --values deploy/helm/sluice/examples/values-cpu.yaml --output -
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import helm_python as helm

DEPLOY_DIR = Path(__file__).resolve().parent
CHART_DIR = DEPLOY_DIR / "helm" / "sluice"
EXAMPLES_DIR = CHART_DIR / "examples"
# The production-shaped example (rollout in progress, external backends,
# monitoring on); the other examples sit beside it as values-<name>.yaml.
EXAMPLE_VALUES = EXAMPLES_DIR / "values-production.yaml"
RENDERED = DEPLOY_DIR / "k8s" / "sluice.yaml"
RELEASE_NAME = "sluice"
NAMESPACE = "sluice"

HEADER = """\
# GENERATED FILE - do not edit. The Helm chart deploy/helm/sluice rendered with
# {source} (release "sluice", namespace "sluice") by
# `python deploy/render.py`; CI fails when it drifts.
"""

_DOCUMENT_SEPARATOR = re.compile(r"^---[ \t]*$", re.MULTILINE)


def load_values(path: Path) -> dict:
    """Parse a values file with Helm's own YAML reader (as `helm -f` would)."""
    return helm.values_from_yaml(path.read_text())


def render_documents(
    values: dict | None = None, *, release: str = RELEASE_NAME, namespace: str = NAMESPACE
) -> list[tuple[str, str]]:
    """(template path, manifest) for every non-empty rendered document, in a
    stable order: by template path, then by position in the template."""
    with helm.Chart.load(CHART_DIR) as chart:
        # render() checks the values against values.schema.json first, as
        # `helm install` does, and raises HelmValuesError when they break it.
        rendered = chart.render(values, name=release, namespace=namespace, is_install=True)
    documents = []
    for template in sorted(rendered):
        if not template.endswith((".yaml", ".yml")):
            continue  # NOTES.txt and the like
        for document in _DOCUMENT_SEPARATOR.split(rendered[template]):
            if _has_content(document):
                documents.append((template, document.strip("\n")))
    return documents


def _has_content(document: str) -> bool:
    return any(line.strip() and not line.lstrip().startswith("#") for line in document.splitlines())


def render_text(values: dict | None = None, *, source: str = "its default values", **kwargs) -> str:
    """The manifests as one multi-document YAML stream, like `helm template`;
    `source` names the values in the header."""
    parts = [HEADER.format(source=source)]
    for template, document in render_documents(values, **kwargs):
        parts.append(f"---\n# Source: {template}\n{document}\n")
    return "".join(parts)


def render_default() -> str:
    """What deploy/k8s/sluice.yaml holds: the chart's own values.yaml, nothing over it."""
    return render_text(None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--values", type=Path, default=None, help="values file (default: the chart's own)")
    parser.add_argument("--output", default=str(RENDERED), help="file to write, or - for stdout")
    parser.add_argument("--check", action="store_true", help="compare with --output instead of writing it")
    args = parser.parse_args(argv)

    text = render_text(load_values(args.values), source=str(args.values)) if args.values else render_default()
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    output = Path(args.output)
    if args.check:
        if not output.exists() or output.read_text() != text:
            print(f"{output} is stale: run `python deploy/render.py`", file=sys.stderr)
            return 1
        return 0
    output.write_text(text)
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
