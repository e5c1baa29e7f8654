"""python -m sluice.devstack.weights CATALOG VERSION=WEIGHT ...

Rewrites the weights of the named versions in a router catalog file, in
one rename (a running router picks the change up on its next poll)."""

import argparse
import sys
from pathlib import Path

from sluice.devstack.catalog import set_weights


def _assignment(text: str) -> tuple[str, int]:
    version, sep, weight = text.partition("=")
    if not sep or not version:
        raise argparse.ArgumentTypeError(f"expected VERSION=WEIGHT, got {text!r}")
    try:
        return version, int(weight)
    except ValueError:
        raise argparse.ArgumentTypeError(f"the weight of {version} is not an integer: {weight!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("catalog", type=Path)
    parser.add_argument("weights", type=_assignment, nargs="+", metavar="VERSION=WEIGHT")
    args = parser.parse_args(argv)
    try:
        document = set_weights(args.catalog, dict(args.weights))
    except (OSError, ValueError, KeyError) as error:
        print(f"not changed: {error}", file=sys.stderr)
        return 1
    for model in document["models"]:
        shares = ", ".join(f"{v['version']}={v.get('weight', 100)}" for v in model["versions"])
        print(f"{model['name']}: {shares}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
