"""An import-linter contract: no import cycle among the modules of a package.

import-linter's own ``acyclic_siblings`` compares siblings only (each package's children,
their descendants folded in), so it misses a package that imports a submodule which imports
the package back (``dedup_jobs.metrics`` <-> ``dedup_jobs.metrics.history``). This contract
works on modules: every import grimp sees counts, function-level (lazy) ones included;
``TYPE_CHECKING``-only ones are left out when the session sets
``exclude_type_checking_imports = true``. A cycle is a strongly connected component of two
or more modules (Tarjan), reported with one shortest cycle through it and its import lines.

Configured in pyproject.toml (``contract_types``, ``type = "acyclic_modules"``); the
``lint-imports`` CLI puts the working directory on ``sys.path``, so ``tools`` imports.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from itertools import pairwise

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def strongly_connected(nodes: Iterable[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's SCCs of two or more nodes, iteratively (no recursion limit), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def shortest_cycle(start: str, component: set[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest path start -> ... -> start inside one component (breadth first)."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(edges[node] & component):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{start} is in no cycle")  # a component of 2+ always has one


class AcyclicModulesContract(Contract):
    """No module of ``packages`` (or their descendants) imports, directly or through others
    of them, a module that imports it back."""

    type_name = "acyclic_modules"

    packages = fields.ListField(subfield=fields.ModuleField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        modules: set[str] = set()
        for package in self.packages:  # type: ignore[attr-defined]
            modules |= {package.name} | graph.find_descendants(package.name)
        edges = {m: graph.find_modules_directly_imported_by(m) & modules for m in modules}
        cycles = []
        for component in strongly_connected(modules, edges):
            path = shortest_cycle(component[0], set(component), edges)
            steps = [
                (importer, imported, graph.get_import_details(importer=importer,
                                                              imported=imported))
                for importer, imported in pairwise(path)
            ]
            cycles.append({"modules": component, "steps": steps})
        output.verbose_print(verbose, f"Found {len(cycles)} import cycle(s).")
        return ContractCheck(kept=not cycles, metadata={"cycles": cycles})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for cycle in check.metadata["cycles"]:
            output.print_error(f"Import cycle among {len(cycle['modules'])} modules: "
                               + ", ".join(cycle["modules"]))
            for importer, imported, details in cycle["steps"]:
                lines = ", ".join(f"l.{d['line_number']} {d['line_contents']!r}"
                                  for d in details)
                output.print_error(f"  {importer} -> {imported} ({lines})", bold=False)
            output.new_line()
