"""Which fast tests also run on the verifiers pre-release (tests/run.sh): those whose file
touches verifiers by what it imports at its top (tests/conftest.py marks them `verifiers_dev`)."""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

TESTS = Path(__file__).parent
_SPEC = importlib.util.find_spec("verifiers_nemogym")  # found, not imported
assert _SPEC is not None and _SPEC.submodule_search_locations
ROOT = Path(_SPEC.submodule_search_locations[0]).parent
VERIFIERS_SIDE = frozenset({"verifiers", "renderers", "nemo_gym_env"})
"""Top-level packages whose import makes a test file one that touches verifiers."""


def _top_imports(path: Path) -> set[str]:
    """What `path` imports when it is imported: module-level imports, those under `if`/`try`
    included, `if TYPE_CHECKING:` blocks and function bodies not (a `from X import name` also
    counts as importing `X.name`, which may be a module)."""
    found: set[str] = set()

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                walk(node.body)
                walk(node.orelse)
            elif isinstance(node, ast.Try):
                for part in (
                    node.body,
                    node.orelse,
                    node.finalbody,
                    *(h.body for h in node.handlers),
                ):
                    walk(part)

    walk(ast.parse(path.read_text()).body)
    return found


def _source(module: str) -> Path | None:
    """The file of `module` when it is the package's or tests/helpers', else None."""
    parts = module.split(".")
    if parts[0] not in ("helpers", "verifiers_nemogym"):
        return None
    base = (TESTS if parts[0] == "helpers" else ROOT).joinpath(*parts)
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


@functools.cache
def touches_verifiers(path: Path) -> bool:
    """Whether importing `path` imports verifiers (or renderers, or the env package): itself or
    through the modules of the package and tests/helpers it imports, followed to the end."""
    seen: set[Path] = set()
    todo = [path]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for module in _top_imports(current):
            if module.split(".")[0] in VERIFIERS_SIDE:
                return True
            if (source := _source(module)) is not None:
                todo.append(source)
    return False
