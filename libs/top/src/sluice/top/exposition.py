"""One /metrics page as samples, indexed by sample name.

Sample names are kept as exposed (`..._total`, `..._bucket`), so a view
asks for exactly the name a PromQL query would use. Family names (from the
`# TYPE` lines) are kept too: a family with no samples yet (a labelled
counter nothing has incremented) is "present, zero", not "absent".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families as text_families

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs


@dataclass(frozen=True, slots=True)
class Series:
    labels: Labels
    value: float

    def label(self, name: str, default: str = "") -> str:
        for key, value in self.labels:
            if key == name:
                return value
        return default

    def matches(self, wanted: Mapping[str, str]) -> bool:
        mine = dict(self.labels)
        return all(mine.get(key) == value for key, value in wanted.items())


@dataclass(frozen=True, slots=True)
class MetricPage:
    """Every sample of one page. `families` holds the declared family names
    (counters without their `_total`, as Prometheus' parser names them)."""

    samples: Mapping[str, tuple[Series, ...]]
    families: frozenset[str]

    def series(self, name: str, **labels: str) -> tuple[Series, ...]:
        found = self.samples.get(name, ())
        return tuple(s for s in found if s.matches(labels)) if labels else found

    def has_family(self, name: str) -> bool:
        """Whether the page declares `name` (a sample name such as
        `x_total` or `x_bucket` counts for its family `x`)."""
        if name in self.samples:
            return True
        for suffix in ("_total", "_bucket", "_count", "_sum"):
            if name.endswith(suffix) and name[: -len(suffix)] in self.families:
                return True
        return name in self.families


def page_from_families(families: Iterable) -> MetricPage:
    samples: dict[str, list[Series]] = defaultdict(list)
    names = set()
    for family in families:
        names.add(family.name)
        for sample in family.samples:
            samples[sample.name].append(Series(tuple(sorted(sample.labels.items())), float(sample.value)))
    return MetricPage({name: tuple(found) for name, found in samples.items()}, frozenset(names))


def parse_page(text: str, content_type: str = "") -> MetricPage:
    """Parse Prometheus text format, or OpenMetrics when the server said so
    (exemplars live only there; the classic parser rejects their syntax)."""
    if content_type.startswith("application/openmetrics-text"):
        return page_from_families(openmetrics_families(text))
    return page_from_families(text_families(text))
