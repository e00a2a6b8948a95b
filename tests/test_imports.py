"""The package's import structure: no import cycle (function-level imports included), nothing
below `cli/` imports it, and the env package uses only the package's public names."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "verifiers_nemogym"
ENV_PACKAGE = ROOT / "environments" / "nemo_gym_env" / "nemo_gym_env"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules `path` imports anywhere in it (a `from X import name` of a module
    `X.name` counts as importing that module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name in modules}


def _graph() -> dict[str, set[str]]:
    paths = {_module(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: _imports(path, modules) - {name} for name, path in paths.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_package_has_no_import_cycle() -> None:
    graph = _graph()
    # A package's __init__ that imports its own modules lazily is not a cycle of the house.
    graph = {m: {i for i in imps if not m.startswith(f"{i}.")} for m, imps in graph.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_nothing_below_the_cli_imports_it() -> None:
    up = sorted(
        f"{m} -> {i}"
        for m, imps in _graph().items()
        if not m.startswith("verifiers_nemogym.cli")
        for i in imps
        if i.startswith("verifiers_nemogym.cli")
    )
    assert up == []


def test_the_env_package_imports_only_public_names() -> None:
    private = []
    for path in ENV_PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "verifiers_nemogym."
            ):
                private.append(f"{path.name}: from {node.module}")
            if isinstance(node, ast.Import):
                private += [a.name for a in node.names if a.name.startswith("verifiers_nemogym.")]
    assert private == []
