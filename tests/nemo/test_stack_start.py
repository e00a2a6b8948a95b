"""`start_stack`'s decision to try a start again, without starting a stack: only the start
that failed because Ray's node timed out (read from `NgRunLog.death_message` of a real ng_run
log shape) or because another process bound the head server's port first (read from ng_run's
real output), before the last attempt and with time for Ray's own wait left before the deadline.
The real retries (a raylet frozen until Ray's node times out; a head port bound by the test) are
in tests/stack/test_faults.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.nemo.ng_log import NgRunLog
from verifiers_nemogym.nemo.stack import (
    HEAD_PORT_TAKEN,
    RAY_NODE_TIMEOUT,
    RAY_NODE_WAIT,
    START_ATTEMPTS,
    NeMoGymStack,
    ray_node_timed_out,
    retry_cause,
    retry_start,
    start_stack,
)

RAY_LINE = (
    "Exception: The current node timed out during startup. This could happen because some of "
    "the raylet failed to startup or the GCS has become overloaded."
)
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "ray/_private/node.py", line 440, in __init__\n'
    "    raise Exception(\n"
)


def death(tmp_path: Path, log: str) -> StackError:
    """The StackError a start raises when ng_run exits with `log` as its output."""
    path = tmp_path / "ng_run.log"
    path.write_text(log)
    return StackError(NgRunLog(path).death_message(1))


def test_only_rays_node_timeout_is_retried(tmp_path: Path):
    ray = death(tmp_path, "NeMo Gym is starting a new Ray cluster...\n" + TRACEBACK + RAY_LINE)
    assert str(ray).startswith("NeMo Gym's ng_run exited with status 1: Exception: The current")
    assert ray_node_timed_out(ray)
    # A crashed server whose output quotes Ray's line: its death is the cause.
    server = death(
        tmp_path,
        f"(weather) {RAY_LINE}\nProcess `weather` finished unexpectedly!\n{TRACEBACK}"
        "RuntimeError: server died\n",
    )
    assert str(server).startswith("NeMo Gym server 'weather' died")
    assert RAY_NODE_TIMEOUT in str(server) and not ray_node_timed_out(server)
    # Bad config: ng_run exits with another cause (Ray's words further down the tail only).
    config = death(tmp_path, f"{TRACEBACK}ValueError: unknown key\n{RAY_LINE}\n")
    assert RAY_NODE_TIMEOUT in str(config) and not ray_node_timed_out(config)
    deadline = StackError(
        f"NeMo Gym stack not ready after 600 s (0/2 up).\n--- ng_run ---\n{RAY_LINE}"
    )
    assert not ray_node_timed_out(deadline)
    assert not ray_node_timed_out(ConfigError(RAY_NODE_TIMEOUT))
    assert not ray_node_timed_out(RuntimeError(RAY_NODE_TIMEOUT))


def test_retry_stops_at_the_last_attempt_and_before_the_deadline(tmp_path: Path):
    ray = death(tmp_path, TRACEBACK + RAY_LINE)
    assert START_ATTEMPTS == 3 and RAY_NODE_WAIT == 30
    assert retry_start(ray, 1, 600) and retry_start(ray, 2, 600)
    assert not retry_start(ray, 3, 600)  # three starts in all
    assert retry_start(ray, 1, RAY_NODE_WAIT + 1)
    assert not retry_start(ray, 1, RAY_NODE_WAIT)  # could not outlast Ray's own wait
    assert not retry_start(ray, 1, -5)
    assert not retry_start(StackError("NeMo Gym stack not ready after 9 s"), 1, 600)


STARTS: list[FailingStart] = []


class FailingStart:
    """Stands in for a `NeMoGymStack` whose start fails with `error` (no stack is started: this
    tier checks only `start_stack`'s loop; the stack test starts real ones)."""

    def __init__(self, error: Exception, seconds: float, made: list[float]) -> None:
        self.error = error
        made.append(seconds)
        self.discarded = False
        STARTS.append(self)

    async def start(self) -> None:
        raise self.error

    def discard_workdir(self) -> None:
        self.discarded = True


async def test_start_stack_tries_again_within_the_deadline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    ray = death(tmp_path, TRACEBACK + RAY_LINE)
    made: list[float] = []

    def make(seconds: float) -> NeMoGymStack:
        return FailingStart(ray, seconds, made)  # type: ignore[return-value]

    caplog.set_level(logging.WARNING)
    with pytest.raises(StackError) as raised:
        await start_stack(make, 600)
    assert raised.value is ray  # the last error stands, as the start raised it
    assert len(made) == START_ATTEMPTS
    # A start tried again leaves no folder; the last one keeps its log (the error points there).
    assert [s.discarded for s in STARTS[-START_ATTEMPTS:]] == [True, True, False]
    assert all(0 < s <= 600 for s in made) and made == sorted(made, reverse=True)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == START_ATTEMPTS - 1
    assert all("Ray's node timed out" in w and "the machine's load" in w for w in warnings)
    # Too little time left for another attempt: one start, its error stands.
    made.clear()
    with pytest.raises(StackError):
        await start_stack(make, RAY_NODE_WAIT)
    assert len(made) == 1
    # Another error is never tried again.
    other = StackError("NeMo Gym server 'weather' died (ng_run exit 1)")
    made.clear()
    with pytest.raises(StackError) as raised:
        await start_stack(lambda s: FailingStart(other, s, made), 600)  # type: ignore[arg-type, return-value]
    assert raised.value is other and len(made) == 1


# ng_run's output when its head server's port was bound by another process first (CI, 0.7.0).
HEAD_BIND_LOG = (
    "Started Ray cluster at 127.0.0.1:45839\n"
    "INFO:     Started server process [13360]\n"
    "Starting `mcqa` from venv /venvs/resources_servers/mcqa/.venv\n"
    "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 37615): "
    "address already in use\n"
    "(mcqa) ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 18641): "
    "address already in use\n"
    "Waiting for head server to spin up\n"
    "Head server is not up yet (status `connection_error`). Sleeping...\n"
)


def test_a_taken_head_port_is_read_from_ng_runs_own_lines_and_tried_again(tmp_path: Path):
    path = tmp_path / "ng_run.log"
    path.write_text(HEAD_BIND_LOG)
    log = NgRunLog(path)
    assert log.bind_failure(37615) == (
        "error while attempting to bind on address ('127.0.0.1', 37615): address already in use"
    )
    assert log.bind_failure(18641) is None  # a server's own line (prefixed) is not the head's
    assert log.bind_failure(11000) is None
    assert NgRunLog(None).bind_failure(37615) is None
    taken = StackError(f"{HEAD_PORT_TAKEN} 127.0.0.1:37615: {log.bind_failure(37615)}")
    assert retry_cause(taken) == "another process bound the head server's port before NeMo Gym did"
    assert retry_start(taken, 1, 600) and not retry_start(taken, START_ATTEMPTS, 600)
    assert not ray_node_timed_out(taken)
    # Only a first line says so: a deadline's log tail quoting it is not a taken port.
    tail = StackError(f"NeMo Gym stack not ready after 600 s.\n{HEAD_PORT_TAKEN} 127.0.0.1:1")
    assert retry_cause(tail) is None and retry_cause(RuntimeError(HEAD_PORT_TAKEN)) is None
