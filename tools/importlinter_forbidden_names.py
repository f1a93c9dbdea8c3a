"""An import-linter contract: the modules of a package, and every module of the project they
import (directly or through others), never name a forbidden module in an import statement.

import-linter's own ``forbidden`` contract sees an external package only as its top-level
name (``django``), so it cannot forbid ``django.tasks`` while allowing ``django.core.cache``;
nor can it name a module that is not installed (``django.tasks`` is Django 6's, the
``django_tasks`` backport may be absent). This contract reads the import statements
themselves (function-level ones included, ``if TYPE_CHECKING:`` blocks left out) of every
project module the source packages reach in grimp's graph, and matches the imported names by
prefix, dotted-name aware.

Configured in pyproject.toml (``contract_types``, ``type = "forbidden_names"``).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_names(source: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every absolute import in ``source``, outside TYPE_CHECKING."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for statement in node.orelse:
                visit(statement)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


class ForbiddenNamesContract(Contract):
    """No module of ``source_modules``, nor any project module they reach, imports a name
    under one of ``forbidden_names``."""

    type_name = "forbidden_names"

    source_modules = fields.ListField(subfield=fields.ModuleField())
    forbidden_names = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        reached: set[str] = set()
        for module in self.source_modules:  # type: ignore[attr-defined]
            for start in {module.name} | graph.find_descendants(module.name):
                reached |= {start} | graph.find_upstream_modules(start)
        project = {m for m in reached if not graph.is_module_squashed(m)}
        forbidden: list[str] = list(self.forbidden_names)  # type: ignore[call-overload]
        found = []
        for module in sorted(project):
            spec = importlib.util.find_spec(module)
            if spec is None or not spec.origin or not spec.origin.endswith(".py"):
                continue  # an external package grimp squashed, or a namespace
            source = Path(spec.origin).read_text(encoding="utf-8")
            seen: set[int] = set()
            for line, name in imported_names(source):
                if line not in seen and any(matches(name, prefix) for prefix in forbidden):
                    seen.add(line)
                    found.append((module, line, name))
        output.verbose_print(verbose, f"Read {len(project)} modules; "
                                      f"{len(found)} forbidden import(s).")
        return ContractCheck(kept=not found, metadata={"found": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for module, line, name in check.metadata["found"]:
            output.print_error(f"{module} l.{line} imports {name}")
        output.new_line()
