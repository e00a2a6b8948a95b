"""The stack tier runs two test files at a time (pytest-xdist, tests/run.sh). Each worker keeps
its shared stacks in a folder of its own (`VF_NEMOGYM_STACKS`), so two files never attach to
each other's stack by asking for the same config set (their assertions about a stack's life
and its processes hold as when run alone), while both use the same runtimes and server venvs."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from verifiers_nemogym.shared.client import STACKS_ENV_VAR
from verifiers_nemogym.util import cache_root


@pytest.fixture(scope="session", autouse=True)
def worker_stacks_folder() -> Iterator[None]:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(STACKS_ENV_VAR, str(cache_root() / f"stacks-{worker}"))
        yield
