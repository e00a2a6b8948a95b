"""A package's public names, imported from their modules on first use (PEP 562).

Contract: a package `__init__` states its public names as `_EXPORTS` (each module, relative to the
package, -> the names it defines), sets `__all__ = public(_EXPORTS)`, and defines
`__getattr__(name)` as `return exported(__name__, _EXPORTS, name)`. Importing the package then
imports none of its modules: helper processes started as `python -m` (the local model) or by a
module's path (the supervisor, run in NeMo Gym's runtime) stay as light as they were, and a name
costs its module's import only when someone reads it. An unknown name is AttributeError, as for
any module.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from typing import Any


def public(exports: Mapping[str, Iterable[str]]) -> list[str]:
    """The names `exports` states, sorted: a package's `__all__`."""
    return sorted(name for names in exports.values() for name in names)


def exported(package: str, exports: Mapping[str, Iterable[str]], name: str) -> Any:
    """`name` from the module of `package` that `exports` says defines it; AttributeError if
    `name` is no export."""
    for module, names in exports.items():
        if name in names:
            return getattr(importlib.import_module(f"{package}.{module}"), name)
    raise AttributeError(f"module {package!r} has no attribute {name!r}")
