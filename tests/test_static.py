"""Static checks as tests, so that `pytest` (all CI runs) also runs the linter, the formatter
check and the type checker, each exactly as a developer runs it from the repository root."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers.evals import script

ROOT = Path(__file__).resolve().parent.parent


def _mypy_cache() -> dict[str, str]:
    """mypy's cache in the user's cache folder, one per verifiers release (the suite also runs
    on a pre-release), unless MYPY_CACHE_DIR is set: a clean clone (CI) starts warm where the
    machine keeps its cache (mypy checks each cached module's source hash, so a cache made from
    another checkout is reused only where the files are the same), about 45 s less per run."""
    if "MYPY_CACHE_DIR" in os.environ:
        return {}
    import verifiers

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return {"MYPY_CACHE_DIR": str(base / "verifiers-nemogym-mypy" / verifiers.__version__)}


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["ruff", "check"], id="ruff-check"),
        pytest.param(["ruff", "format", "--check"], id="ruff-format"),
        # mypy reads verifiers' source: it also type-checks against the pre-release (run.sh).
        pytest.param(["mypy"], id="mypy", marks=pytest.mark.verifiers_dev),
    ],
)
def test_static_check_passes(command: list[str]) -> None:
    extra = _mypy_cache() if command[0] == "mypy" else {}
    out = subprocess.run(
        [script(command[0]), *command[1:]],
        cwd=ROOT,
        env={**os.environ, **extra},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, f"{' '.join(command)} failed:\n{out.stdout[-6000:]}{out.stderr}"
