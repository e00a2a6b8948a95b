"""Processes the tests start and look for: the run tag every child inherits, running a command
with a bound, the tests' one poll (`until`, `wait_gone`, `gone`), and who listens on a port.

Process checks read /proc through `verifiers_nemogym.nemo.supervisor` (`processes_with_env`, the
scan the stack itself uses): every process a stack or a local model server starts carries a
marker variable in its environment, and so does every descendant of a tagged process. Waits go
through the package's `util.poll_until`.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR as STACK_MARKER_VAR
from verifiers_nemogym.nemo.supervisor import alive, env_value, processes_with_env
from verifiers_nemogym.policies.local_model import MARKER_ENV_VAR as MODEL_MARKER_VAR
from verifiers_nemogym.util import poll_until, wait_until

REPO = Path(__file__).resolve().parents[2]
"""The repository root (wherever under tests/ the test that asks for it lives)."""


TEST_RUN_VAR = "VF_NEMOGYM_TEST_RUN"
"""Tag a test puts on a subprocess it starts; every descendant inherits it."""


SESSION_VAR = "VF_NEMOGYM_TEST_SESSION"
"""Tag of the whole pytest session, set in conftest: it finds what this session started among
the stacks other people run on the same machine."""


@dataclass
class Launches:
    """Markers of the stacks and model servers the current test started in this process
    (recorded by conftest's `launches` fixture)."""

    stacks: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)


def run_tag(**extra: str) -> tuple[str, dict[str, str]]:
    """A fresh `VF_NEMOGYM_TEST_RUN=<hex>` entry, and this process's environment plus it (and
    plus `extra`, e.g. `SCRIPTED_KEY="unused"`)."""
    value = uuid.uuid4().hex
    return f"{TEST_RUN_VAR}={value}", {**os.environ, **extra, TEST_RUN_VAR: value}


async def run_command(
    cmd: list[str], env: dict[str, str], timeout: float = 900, *, stdout_only: bool = False
) -> tuple[int, str]:
    """Run `cmd` (a `vf-eval` or `nemo-gym-env` command line) with `env`; its exit code and
    output: stdout and stderr together, or with `stdout_only` stdout alone (results go to
    stdout, the CLI's logs to stderr). After `timeout` seconds it is killed (and reaped) and
    TimeoutError raised, so a hung command never outlives the test."""
    stderr = asyncio.subprocess.DEVNULL if stdout_only else asyncio.subprocess.STDOUT
    proc = await asyncio.create_subprocess_exec(
        *cmd, env=env, stdout=asyncio.subprocess.PIPE, stderr=stderr
    )
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, output.decode(errors="replace")


def launched_processes(entry: str) -> list[int]:
    """PIDs of live processes carrying `entry` that belong to a NeMo Gym stack or a local model
    server (their environment has the stack's or the model server's marker variable)."""
    return [
        pid
        for pid in processes_with_env(entry)
        if any(env_value(pid, name) is not None for name in (STACK_MARKER_VAR, MODEL_MARKER_VAR))
    ]


SHARED_STACK_GONE_S = 60.0
"""Bound on a shared stack's exit after its last user left: the idle grace (5 s by default)
plus the stack's teardown (NeMo Gym's own shutdown, then the supervisor's SIGTERM/SIGKILL)."""


async def until(probe: Callable[[], Any], seconds: float, what: str, every: float = 0.1) -> Any:
    """The tests' one poll: `probe` (a function or coroutine function) until it returns a
    truthy value, which is returned; an AssertionError naming `what` after `seconds`."""
    value = await poll_until(probe, time.monotonic() + seconds, every)
    assert value, f"not within {seconds:g} s: {what}"
    return value


async def gone(entry: str, seconds: float = SHARED_STACK_GONE_S) -> list[int]:
    """Wait (bounded) until no process carries `entry` (`NAME=value` in its environment);
    return the survivors."""
    await poll_until(lambda: not processes_with_env(entry), time.monotonic() + seconds, 0.5)
    return processes_with_env(entry)


def wait_gone(pids: list[int] | int, seconds: float) -> bool:
    """Block (bounded) until every PID in `pids` has exited (zombies count as exited)."""
    pids = [pids] if isinstance(pids, int) else pids
    return wait_until(lambda: not any(map(alive, pids)), time.monotonic() + seconds, 0.2)


def server_pid(port: int) -> int:
    """PID of the process listening on 127.0.0.1:`port` (from /proc/net/tcp and fd links)."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # LISTEN
            inode = fields[9]
    assert inode is not None, f"nothing listens on port {port}"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) == f"socket:[{inode}]":
                    return int(proc.name)
        except OSError:
            continue
    raise AssertionError(f"no process owns the socket on port {port}")
