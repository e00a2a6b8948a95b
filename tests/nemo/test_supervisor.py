"""The supervisor (nemo/supervisor.py) run as the stack runs it, on real processes standing in
for ng_run: what its teardown reaches, what happens when it is killed itself, and that its
signals never hit a process that reused a scanned PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.processes import wait_gone

from verifiers_nemogym.nemo import supervisor
from verifiers_nemogym.nemo.supervisor import processes_with_env, signal_with_env
from verifiers_nemogym.util import wait_until

SUPERVISOR = Path(supervisor.__file__)


def _wait_for_file(path: Path, seconds: float = 20) -> str:
    deadline = time.monotonic() + seconds
    while not (path.exists() and path.read_text().endswith("\n")):
        assert time.monotonic() < deadline, f"{path} was never written"
        time.sleep(0.05)
    return path.read_text()


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """The supervisor running a stand-in for ng_run that forks a grandchild with an EMPTY
    environment in a session of its own (as a code sandbox started with `env={}` does), then
    sleeps. `tmp_path/pids` gets "<command pid> <grandchild pid>\\n"."""
    pids = tmp_path / "pids"
    command = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                 env={{}}, start_new_session=True)
        with open({str(pids)!r}, "w") as f:
            f.write(f"{{os.getpid()}} {{child.pid}}\\n")
        time.sleep(120)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-I", str(SUPERVISOR), "--marker", uuid.uuid4().hex,
         "--log", str(tmp_path / "log"), "--cwd", str(tmp_path),
         "--", sys.executable, "-c", command],
        stdin=subprocess.PIPE,
    )  # fmt: skip
    try:
        yield proc, pids
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pids.exists():
            for pid in map(int, pids.read_text().split()):
                _kill_if_alive(pid)


def _kill_if_alive(pid: int) -> None:
    """Kill `pid` if it still is one of the fixture's sleepers (pinned by a pidfd first)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if b"sleep(120)" in Path(f"/proc/{pid}/cmdline").read_bytes():
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)


def test_teardown_sweeps_a_descendant_that_cleared_its_env_and_left_the_session(
    supervised: tuple[subprocess.Popen[bytes], Path],
) -> None:
    proc, pids = supervised
    _, grandchild = map(int, _wait_for_file(pids).split())
    assert b"VF_NEMOGYM_STACK" not in Path(f"/proc/{grandchild}/environ").read_bytes()
    assert proc.stdin is not None
    proc.stdin.close()  # the owner is done: teardown
    assert proc.wait(timeout=30) == 0
    assert wait_gone(grandchild, 5), "the env-less, session-less grandchild outlived teardown"


def test_sigkill_of_the_supervisor_still_stops_its_command(
    supervised: tuple[subprocess.Popen[bytes], Path],
) -> None:
    """No teardown can run: the kernel's parent-death signal (SIGINT) ends the command."""
    proc, pids = supervised
    command, _ = map(int, _wait_for_file(pids).split())
    proc.kill()
    proc.wait()
    assert wait_gone(command, 10), "the command outlived its SIGKILLed supervisor"


def _spawn(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "120"], env=env)


def test_signal_with_env_spares_a_process_that_reused_a_scanned_pid() -> None:
    """Scan, the scanned process exits, another process gets its PID (forced through
    /proc/sys/kernel/ns_last_pid, root only), then the signal: the newcomer is spared."""
    entry = f"VF_NEMOGYM_TEST_REUSE={uuid.uuid4().hex}"
    name, value = entry.split("=")
    marked = _spawn({**os.environ, name: value})
    # A loaded machine may show the new environ late.
    scanned = [marked.pid]
    assert wait_until(lambda: processes_with_env(entry) == scanned, time.monotonic() + 10, 0.05)
    marked.kill()
    marked.wait()
    newcomer = None
    try:
        for _ in range(200):  # another process or thread may take the PID first
            try:
                Path("/proc/sys/kernel/ns_last_pid").write_text(str(marked.pid - 1))
            except OSError as e:
                pytest.skip(f"cannot choose the next PID here ({e.strerror}); needs root")
            newcomer = _spawn(dict(os.environ))
            if newcomer.pid == marked.pid:
                break
            newcomer.kill()
            newcomer.wait()
            newcomer = None
        assert newcomer is not None, "could not get the scanned PID reused"
        assert signal_with_env(scanned, entry, signal.SIGKILL) == []
        time.sleep(0.2)
        assert newcomer.poll() is None, "the process that reused the PID was killed"
        # And a process still carrying the entry is signalled.
        again = _spawn({**os.environ, name: value})
        assert signal_with_env(processes_with_env(entry), entry, signal.SIGKILL) == [again.pid]
        assert again.wait(timeout=5) == -signal.SIGKILL
    finally:
        if newcomer is not None:
            newcomer.kill()
            newcomer.wait()


@pytest.mark.parametrize("attempt", range(20))  # a race: many tries
def test_a_command_that_exits_at_once_ends_the_supervisor(tmp_path: Path, attempt: int) -> None:
    """Its exit is noticed (and is the supervisor's status) without the owner closing the
    pipe: nothing but the supervisor's own reaping may collect the command."""
    proc = subprocess.Popen(
        [sys.executable, "-I", str(SUPERVISOR), "--marker", uuid.uuid4().hex,
         "--log", str(tmp_path / "log"), "--cwd", str(tmp_path),
         "--", "sh", "-c", "echo broken; exit 1"],
        stdin=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.wait(timeout=10) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_alive_with_a_start_time_names_one_process_not_a_later_one_with_its_pid() -> None:
    """`alive(pid, started_at)`: true for the process that started then, false for a start
    time that is not that PID's (a later process given a reused PID) and for an exited one."""
    me, start = os.getpid(), supervisor.started(os.getpid())
    assert start is not None
    assert supervisor.alive(me) and supervisor.alive(me, start)
    assert not supervisor.alive(me, start + 1)
    child = subprocess.Popen(["true"])
    child.wait()  # reaped: its PID names no process
    assert supervisor.started(child.pid) is None
    assert not supervisor.alive(child.pid) and not supervisor.alive(child.pid, start)
