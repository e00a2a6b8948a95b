"""What the wheel declares and carries: every distribution the package's code imports is a
declared dependency (not something that happens to arrive through verifiers), and both typed
packages carry `py.typed`, so users' type checkers read their annotations."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from helpers.evals import script

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "verifiers_nemogym", ROOT / "environments" / "nemo_gym_env" / "nemo_gym_env"]
NOT_OURS = {
    "ray": "nemo/ray_probe.py runs in the NeMo Gym runtime venv, never in ours",
    "xllamacpp": "the `local` extra (the CPU model server's child process)",
    "nemo_gym": "nemo/aggregate_probe.py runs in the NeMo Gym runtime venv, never in ours",
    "fastapi": "nemo/aggregate_probe.py runs in the NeMo Gym runtime venv, never in ours",
    "resources_servers": "containers/verify_guard.py runs as a NeMo Gym server, in its venv",
}


def _imported_modules() -> set[str]:
    found: set[str] = set()
    for root in SOURCES:
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    ours = {"__future__", "verifiers_nemogym", "nemo_gym_env"}
    return found - set(sys.stdlib_module_names) - ours


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~;\[ ]", dep, maxsplit=1)[0] for dep in project["dependencies"]}
    return {name.lower().replace("_", "-") for name in names}


def test_every_imported_distribution_is_declared() -> None:
    owners = importlib.metadata.packages_distributions()
    missing = {
        module: owners.get(module, ["?"])[0]
        for module in _imported_modules() - NOT_OURS.keys()
        if not {d.lower().replace("_", "-") for d in owners.get(module, [])} & _declared()
    }
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_the_wheel_carries_py_typed(tmp_path: Path) -> None:
    subprocess.run(
        [script("uv"), "build", "--wheel", "--out-dir", str(tmp_path), "--quiet"],
        cwd=ROOT, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("verifiers_nemogym-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {"verifiers_nemogym/py.typed", "nemo_gym_env/py.typed"} <= names
