"""Label and field selectors as the Kubernetes API server reads them, for
the fake API server (tests/support/fake_kube_api.py).

    app=x, app==x, app!=x, app in (x,y), app notin (x), app, !app

Requirements are joined by commas (AND); commas inside parentheses belong
to a set. Field selectors: `metadata.name` and `metadata.namespace` with
=, == and !=, which is what list/watch of one named object uses."""

import re

_SET = re.compile(r"^\s*([^\s!=()]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQUALITY = re.compile(r"^\s*([^\s!=()]+)\s*(==|=|!=)\s*([^\s!=()]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([^\s!=()]+)\s*$")


class SelectorError(ValueError):
    """The selector does not parse; the server answers 400."""


def requirements(selector: str) -> list[str]:
    """Split on the commas that are not inside a set's parentheses."""
    parts, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current)
    return [part for part in parts if part.strip()]


def matches_labels(selector: str, labels: dict[str, str]) -> bool:
    return all(_matches_one(requirement, labels) for requirement in requirements(selector))


def _matches_one(requirement: str, labels: dict[str, str]) -> bool:
    if found := _SET.match(requirement):
        key, operator, values = found.groups()
        members = {value.strip() for value in values.split(",") if value.strip()}
        return (labels.get(key) in members) if operator == "in" else (labels.get(key) not in members)
    if found := _EQUALITY.match(requirement):
        key, operator, value = found.groups()
        return (labels.get(key) == value) if operator != "!=" else (labels.get(key) != value)
    if found := _EXISTS.match(requirement):
        negated, key = found.groups()
        return (key in labels) != bool(negated)
    raise SelectorError(f"unable to parse requirement: {requirement!r}")


def matches_fields(selector: str, name: str, namespace: str) -> bool:
    fields = {"metadata.name": name, "metadata.namespace": namespace}
    for requirement in requirements(selector):
        found = _EQUALITY.match(requirement)
        if found is None or found.group(1) not in fields:
            raise SelectorError(f"field selector {requirement!r} is not supported")
        key, operator, value = found.groups()
        if (fields[key] == value) == (operator == "!="):
            return False
    return True
