"""Static checks as tests, so that `pytest` (all CI runs) also runs the linter, the formatter
check and the type checker, each exactly as a developer runs it from the repository root."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers import script

ROOT = Path(__file__).resolve().parent.parent


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
    out = subprocess.run(
        [script(command[0]), *command[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, f"{' '.join(command)} failed:\n{out.stdout[-6000:]}{out.stderr}"
