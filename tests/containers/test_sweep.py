"""Which stacks the container sweep keeps (containers/docker.py), read from real processes.

The sweep itself (docker's objects removed) is tested on a real daemon in
tests/stack/containers/test_containers.py; this is its reading of /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from verifiers_nemogym.containers.docker import _running
from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def markers() -> Iterator[list[str]]:
    """Three fresh markers: one a process carries in its environment, one a process carries
    on its command line, one nobody carries."""
    by_env, by_argv, gone = (uuid.uuid4().hex for _ in range(3))
    procs = [
        subprocess.Popen(SLEEP, env={**os.environ, MARKER_ENV_VAR: by_env}),
        subprocess.Popen([*SLEEP, by_argv]),
    ]
    try:
        yield [by_env, by_argv, gone]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_stack_runs_while_a_process_carries_its_marker_in_its_environment_or_command_line(
    markers: list[str],
) -> None:
    by_env, by_argv, _ = markers
    assert _running(markers) == {by_env, by_argv}
    # Only the exact environment entry counts: a marker the entry's value begins with is
    # another stack.
    assert _running([by_env[:-1]]) == set()


def test_a_killed_process_no_longer_keeps_its_stack() -> None:
    marker = uuid.uuid4().hex
    proc = subprocess.Popen(SLEEP, env={**os.environ, MARKER_ENV_VAR: marker})
    try:
        assert _running([marker]) == {marker}
    finally:
        proc.kill()
        proc.wait()
    assert _running([marker]) == set()
