"""The one way the package runs a command to completion (util.run_checked): its stdout, or a
one-line error naming what ran, how it ended and why."""

from __future__ import annotations

import sys

import pytest

from verifiers_nemogym.errors import StackError, VenvSetupError
from verifiers_nemogym.util import run_checked, run_uv

PY = sys.executable


def test_a_command_that_succeeds_gives_its_stdout() -> None:
    assert run_checked([PY, "-c", "print('out')"], "printing", 30) == "out\n"


def test_a_failed_command_is_one_line_with_its_exit_status_and_last_line() -> None:
    script = "import sys; print('progress'); print('first', file=sys.stderr); sys.exit('the cause')"
    with pytest.raises(StackError) as caught:
        run_checked([PY, "-c", script], "`tool make`", 30)
    assert str(caught.value) == "`tool make` failed (exit 1): the cause"


def test_a_command_past_its_timeout_is_killed_and_named() -> None:
    with pytest.raises(StackError, match=r"^sleeping took over 1 s$"):
        run_checked([PY, "-c", "import time; time.sleep(30)"], "sleeping", 1)


def test_a_caller_picks_the_error_and_how_the_output_is_read() -> None:
    script = (
        "import sys; print('npm error 404 not found');"
        "print('npm error log at x', file=sys.stderr); sys.exit(2)"
    )
    with pytest.raises(ConnectionError, match=r"failed \(exit 2\): npm error 404 not found$"):
        run_checked(
            [PY, "-c", script], "install", 30, error=ConnectionError,
            reason=lambda text: text.splitlines()[0],
        )  # fmt: skip


def test_a_failed_uv_command_keeps_its_last_thirty_lines() -> None:
    script = "import sys; [print(i, file=sys.stderr) for i in range(40)]; sys.exit(1)"
    with pytest.raises(VenvSetupError) as caught:
        run_uv([PY, "-c", script], {}, "uv sync of x")
    head, *tail = str(caught.value).splitlines()
    assert head == "uv sync of x failed (exit 1): its last lines:"
    assert tail == [str(i) for i in range(10, 40)]
