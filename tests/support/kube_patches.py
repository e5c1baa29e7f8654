"""The two patch formats the fake Kubernetes API applies (tests/support/fake_kube_api.py).
The server also takes strategic-merge patches; for the plain objects Sluice
patches (a ConfigMap's data, annotations) they act as a JSON merge patch."""

import copy
from typing import Any


class PatchError(Exception):
    """The patch cannot apply; the server answers 422."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def json_patch(target: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add/replace/remove/test; a failed test or a missing path raises PatchError."""
    doc = copy.deepcopy(target)
    for op in operations:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node: Any = doc
        try:
            for part in parents:
                node = node[int(part)] if isinstance(node, list) else node[part]
            key: Any = (len(node) if last == "-" else int(last)) if isinstance(node, list) else last
            if op["op"] == "test":
                if node[key] != op["value"]:
                    raise PatchError(f"test failed at {op['path']}")
            elif op["op"] == "remove":
                del node[key]
            elif op["op"] == "add" and isinstance(node, list):
                node.insert(key, op["value"])
            elif op["op"] in ("add", "replace"):
                if op["op"] == "replace":
                    node[key]  # noqa: B018 - replace needs the member to exist
                node[key] = op["value"]
            else:
                raise PatchError(f"unsupported op {op['op']}")
        except (KeyError, IndexError, ValueError, TypeError) as error:
            raise PatchError(f"json patch {op}: {error!r}") from error
    return doc
