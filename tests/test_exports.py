"""The package's public names (`__all__` of the root and of each sub-package, read lazily by
`exports.exported`): every stated name resolves to an object its module defines, an unknown name
is AttributeError, and importing a package imports none of its modules (a fresh interpreter)."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import subprocess
import sys

import pytest

import verifiers_nemogym

LAZY = ("", ".bridge", ".conformance", ".containers", ".judge", ".nemo", ".policies", ".shared")
PACKAGES = [f"verifiers_nemogym{suffix}" for suffix in LAZY]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_is_its_modules_own(package: str) -> None:
    module = importlib.import_module(package)
    exports = {name: where for where, names in module._EXPORTS.items() for name in names}
    assert module.__all__ == sorted(exports) and module.__all__
    # A name that is also a module's would read as the module once that module is imported.
    assert not set(exports) & {m.name for m in pkgutil.iter_modules(module.__path__)}
    for name, where in exports.items():
        value = getattr(module, name)
        home = importlib.import_module(f"{package}.{where}")
        assert value is getattr(home, name), (package, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__ == home.__name__, f"{package}.{name} is {value.__module__}'s"
    with pytest.raises(AttributeError, match="no attribute 'absent'"):
        module.absent  # noqa: B018


def test_cli_states_its_public_names() -> None:
    from verifiers_nemogym import cli

    assert cli.__all__ == ["COMMANDS", "main"]
    assert all(hasattr(cli, name) for name in cli.__all__)


def test_importing_a_package_imports_none_of_its_modules() -> None:
    script = (
        "import importlib, json, sys\n"
        f"for p in {PACKAGES!r}: importlib.import_module(p)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('verifiers_nemogym'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(done.stdout) == sorted([*PACKAGES, "verifiers_nemogym.exports"])
    assert verifiers_nemogym.__all__  # the root states its names too
