"""The house's shape (docs/development.md): which package may import which, and no
import cycle between modules. Every import counts, the lazy ones inside functions too:
a cycle hidden in a function is still a cycle to whoever reads the code."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("resilience", "engine", "cache", "gateway", "loadtest", "bench", "cli")
# Who may import whom. resilience (what the cache and the KV store share: the circuit
# breaker, Redis URLs to clients) is below the ground floor; engine and cache are the
# ground floor; the gateway serves on them, and the benchmarks measure all three; the
# load generator talks HTTP (it reads workloads and report helpers from
# bench, sizes prompts with the engine's tokenizer, and starts the servers it measures:
# `semgate serve` processes, and the Redis of a KV store); cli is the composition root.
ALLOWED = {
    "resilience": set(),
    "engine": {"resilience"},
    "cache": {"resilience"},
    "gateway": {"engine", "cache", "resilience"},
    "bench": {"engine", "cache", "gateway", "resilience"},
    "loadtest": {"engine", "cache", "gateway", "bench"},
    "cli": {"engine", "cache", "gateway", "bench", "loadtest"},
}


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imported modules of this project (a `from pkg import sub` names
    the submodule, a `from pkg import name` the package)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [
                    f"{node.module}.{alias.name}"
                    if f"{node.module}.{alias.name}" in modules
                    else node.module
                    for alias in node.names
                ]
            else:
                continue
            for target in targets:
                while target and target not in modules:  # an attribute of a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            if component:
                cycles.append(sorted([node, *component]))

    for node in list(graph):
        if node not in index:
            visit(node)
    return cycles


def test_packages_import_only_downward():
    graph = _imports(_modules())
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        if (a := module.split(".")[0]) != (b := target.split(".")[0]) and b not in ALLOWED[a]
    )
    assert wrong == []


def test_no_module_import_cycles():
    assert _cycles(_imports(_modules())) == []
