"""The package's import structure: no import cycle (function-level imports included), nothing
below `cli/` imports it, the env package uses only the package's public names, and a slow
import that only one path needs waits for that path."""

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


def _folder(module: str) -> str | None:
    """`verifiers_nemogym.<folder>` for a module of a sub-package (a folder); None for the
    package's top-level modules."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or (PACKAGE / parts[-1]).is_dir() else None


def test_no_loop_between_folders() -> None:
    """A folder (a sub-package) is one node: `nemo/` importing `containers/`, which imports
    `nemo/`, is a loop even when no two modules import each other (a function-level import
    counts). The stack gets what prepares its sandboxes from above, by the contract of
    `nemo/sandboxes.py`."""
    folders: dict[str, set[str]] = {}
    for module, imports in _graph().items():
        if (node := _folder(module)) is not None:
            found = {f for i in imports if (f := _folder(i)) is not None and f != node}
            folders.setdefault(node, set()).update(found)
    assert _cycle(folders) is None, " -> ".join(_cycle(folders) or [])


DEFERRED = ("packaging.requirements", "packaging.specifiers")
"""Modules no module of the package imports at its top: packaging's requirement parser compiles
its specifier regex at import (0.15-0.25 s on 2 cores, measured 2026-11-28), which every env
process paid at start; only a `sandbox_packages` line needs it."""


def test_slow_imports_one_path_needs_are_not_at_a_modules_top() -> None:
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:  # the module's top, not its functions
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [f"{path.name}: {name}" for name in names if name in DEFERRED]
    assert found == []
