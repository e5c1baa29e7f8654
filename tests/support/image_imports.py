"""What a distribution's source imports, found with `ast`, and which
installed distribution provides each imported module.

Two kinds of import are reported but marked optional, so a caller may exempt
them: one inside `if TYPE_CHECKING:` (never executed) and one inside a `try:`
whose handler catches ImportError or ModuleNotFoundError (the code works
without it). Relative imports stay inside their own package and are skipped.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path

from support.image_distributions import canonical

_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError"}


@dataclass(frozen=True, slots=True)
class ImportSite:
    module: str  # absolute dotted name, e.g. "opentelemetry.sdk.trace"
    member: str | None  # `from module import member`: maybe a submodule ("trace" of "opentelemetry")
    path: Path
    line: int
    optional: str | None  # why it may be exempt ("TYPE_CHECKING", "try/except ImportError"), else None

    def where(self, root: Path) -> str:
        return f"{self.path.relative_to(root)}:{self.line}"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    caught = handler.type
    names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
    return any(isinstance(n, ast.Name) and n.id in _IMPORT_ERRORS for n in names if n is not None)


class _Collector(ast.NodeVisitor):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.sites: list[ImportSite] = []
        self._optional: list[str] = []  # innermost reason last

    def _add(self, module: str, member: str | None, node: ast.AST) -> None:
        reason = self._optional[-1] if self._optional else None
        self.sites.append(ImportSite(module, member, self.path, node.lineno, reason))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, None, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or node.module is None:
            return  # relative: inside the importing package itself
        for alias in node.names:
            if node.module == "sluice":  # `from sluice import v1` imports the package sluice.v1
                self._add(f"sluice.{alias.name}", None, node)
            else:
                self._add(node.module, alias.name, node)

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._optional.append("TYPE_CHECKING")
            for child in node.body:
                self.visit(child)
            self._optional.pop()
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Try(self, node: ast.Try) -> None:
        guarded = any(_catches_import_error(h) for h in node.handlers)
        if guarded:
            self._optional.append("try/except ImportError")
        for child in node.body:
            self.visit(child)
        if guarded:
            self._optional.pop()
        for child in [*node.handlers, *node.orelse, *node.finalbody]:
            self.visit(child)

    visit_TryStar = visit_Try


def imports_in(source_root: Path) -> Iterator[ImportSite]:
    """Every absolute import in the .py files under `source_root`."""
    for path in sorted(source_root.rglob("*.py")):
        collector = _Collector(path)
        collector.visit(ast.parse(path.read_text(), filename=str(path)))
        yield from collector.sites


def is_stdlib(module: str) -> bool:
    return module.split(".", 1)[0] in sys.stdlib_module_names


@cache
def _top_level_providers() -> dict[str, tuple[str, ...]]:
    return {top: tuple(sorted({canonical(d) for d in dists})) for top, dists in metadata.packages_distributions().items()}


@cache
def _module_files(distribution: str) -> frozenset[str]:
    """Dotted names of the packages and modules `distribution` installs."""
    dotted = set()
    for file in metadata.distribution(distribution).files or []:
        parts = file.parts
        if file.suffix in (".py", ".pyi", ".so", ".pyd") and ".dist-info" not in file.parts[0]:
            stem = parts[-1].split(".", 1)[0]
            names = [*parts[:-1]] if stem == "__init__" else [*parts[:-1], stem]
            for depth in range(1, len(names) + 1):
                dotted.add(".".join(names[:depth]))
    return frozenset(dotted)


def providers_of(site: ImportSite) -> tuple[str, ...]:
    """The installed distributions (canonical names) that provide the
    module `site` imports.

    A top-level name several distributions share is a namespace package
    (`opentelemetry`, `google`); then the one whose files hold the longest
    prefix of the dotted name provides it (`opentelemetry.sdk.trace` comes
    from opentelemetry-sdk, `from opentelemetry import trace` from
    opentelemetry-api). An empty tuple: nothing installed here provides it.
    """
    candidates = _top_level_providers().get(site.module.split(".", 1)[0], ())
    if len(candidates) <= 1:
        return candidates
    parts = [*site.module.split("."), *([site.member] if site.member else [])]
    for depth in range(len(parts), 0, -1):
        prefix = ".".join(parts[:depth])
        holders = tuple(d for d in candidates if prefix in _module_files(d))
        if holders:
            return holders
    return candidates
