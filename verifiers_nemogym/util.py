"""Plumbing shared by the package: the cache folder, running a command (`run_checked`) and
`uv`, child environments, file locks, waiting for a condition (`poll_until`), a reason set
once (`Latch`) and stopping tasks (`cancel_and_wait`). (Reading /proc is `nemo/supervisor.py`'s.)

Contract: nothing here knows NeMo Gym or verifiers; every function is safe to call from any
process of the package (library, CLI, stack host, model servers).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from verifiers_nemogym.errors import ConfigError, StackError, VenvSetupError

T = TypeVar("T")

CACHE_ENV_VAR = "VF_NEMOGYM_CACHE"
# Variables that would make a child use the parent's venv or Python instead of its own.
_PARENT_ENV_VARS = (
    "VIRTUAL_ENV",
    "PYTHONHOME",
    "PYTHONPATH",
    "UV_PROJECT_ENVIRONMENT",
    "CONDA_PREFIX",
)


def cache_root() -> Path:
    """Root of everything this package caches (release files, runtimes, per-server venvs,
    stacks, models): `$VF_NEMOGYM_CACHE`, else `$XDG_CACHE_HOME/verifiers-nemogym`."""
    if explicit := os.environ.get(CACHE_ENV_VAR):
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "verifiers-nemogym"


def private_dir(path: Path) -> Path:
    """`path`, created (mode 0700) if missing, after checking it is a real folder owned by this
    uid and writable by no one else (as ssh checks ~/.ssh). Another user who can write into the
    cache could plant runtimes or server venvs, or serve a fake stack host that learns a proxy
    secret, so a folder that fails the check is a one-line ConfigError saying what to do
    instead of being used."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(parents=True, mode=0o700)
    info = path.lstat()
    uid = os.getuid()
    problem = ""
    if not stat.S_ISDIR(info.st_mode):
        problem = "is not a folder (a symlink?)"
    elif info.st_uid != uid:
        problem = f"is owned by uid {info.st_uid}, not by you (uid {uid})"
    elif info.st_mode & 0o022:
        problem = f"is group- or world-writable (mode {stat.S_IMODE(info.st_mode):o})"
    if problem:
        raise ConfigError(
            f"the cache folder {path} {problem}; run `chmod go-w` on it if it is yours, or set "
            f"{CACHE_ENV_VAR} to a private folder"
        )
    return path


def private_cache(*parts: str) -> Path:
    """`cache_root()/<parts...>`, each level checked by `private_dir` (the cache root first)."""
    path = private_dir(cache_root())
    for part in parts:
        path = private_dir(path / part)
    return path


def uv_cache_dir() -> Path:
    """uv's own cache folder (uv's default on Linux), shared so per-server venvs build from it."""
    if explicit := os.environ.get("UV_CACHE_DIR"):
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "uv"


def find_uv(*, required: bool = True) -> Path | None:
    """The `uv` binary: the `uv` Python package's one if installed, else the one on PATH."""
    try:
        from uv import find_uv_bin

        return Path(find_uv_bin())
    except (ImportError, FileNotFoundError):
        pass
    if found := shutil.which("uv"):
        return Path(found)
    if required:
        raise VenvSetupError(
            "`uv` was not found (neither the `uv` Python package nor `uv` on PATH); "
            "install it with `pip install uv`."
        )
    return None


def clean_env() -> dict[str, str]:
    """The parent's environment minus what would make a child use the parent's venv or Python."""
    env = dict(os.environ)
    for key in _PARENT_ENV_VARS:
        env.pop(key, None)
    return env


def last_line(text: str) -> str:
    """The last non-blank line of `text`, at most 300 characters ("no output" if none)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def run_checked(
    args: Sequence[str],
    what: str,
    timeout: float,
    *,
    error: type[Exception] = StackError,
    reason: Callable[[str], str] = last_line,
    **kwargs: Any,
) -> str:
    """Run `args` to completion (stdin closed) and return its stdout. `error` naming `what`
    if it takes over `timeout` seconds or exits non-zero; then with `reason` of its output
    (stdout, then stderr), by default its last line."""
    try:
        out = subprocess.run(
            list(args), capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL, **kwargs,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise error(f"{what} took over {timeout:.0f} s") from None
    if out.returncode != 0:
        said = reason(f"{out.stdout}\n{out.stderr}")
        raise error(f"{what} failed (exit {out.returncode}): {said}")
    return str(out.stdout)


def run_uv(args: list[str], env: dict[str, str], what: str) -> None:
    """Run a `uv` command to completion; `VenvSetupError` naming `what` (and uv's last 30
    lines) if it fails or takes over 30 minutes."""
    run_checked(args, what, 1800, error=VenvSetupError, reason=_tail, env=env)


def _tail(text: str) -> str:
    return "its last lines:\n" + "\n".join(text.strip().splitlines()[-30:])


def open_nofollow(path: Path, binary: bool = False) -> IO[Any]:
    """`path` opened for appending (created 0600), refusing a symlink (OSError ELOOP): a
    planted link would make us write or lock a file of someone else's choosing."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    return os.fdopen(fd, "ab" if binary else "a")


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on `path` (created with its folders); released by the kernel
    if this process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open_nofollow(path) as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def try_flock(path: Path) -> IO[str] | None:
    """`path` (created with its folders) opened and exclusively flocked, or None if another
    holder has it. Closing the handle releases the lock (so does this process dying)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open_nofollow(path)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


async def poll_until(probe: Callable[[], T | Awaitable[T]], deadline: float, interval: float) -> T:
    """The package's one "wait until this holds or the deadline passes": call `probe` (a
    function or a coroutine function) every `interval` seconds, without blocking the event
    loop, until it returns a truthy value or `time.monotonic()` passes `deadline`; returns
    its last value (falsy: timed out, the caller says what did not happen)."""
    while True:
        value = probe()
        if isinstance(value, Awaitable):
            value = await value
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(interval)


def wait_until(probe: Callable[[], T], deadline: float, interval: float) -> T:
    """`poll_until` for a caller without an event loop (a thread, a test's teardown)."""
    while not (value := probe()) and time.monotonic() <= deadline:
        time.sleep(interval)
    return value


async def acquire_flock(
    path: Path, deadline: float, *, poll: float = 0.1, on_wait: Callable[[], None] | None = None
) -> IO[str]:
    """`try_flock(path)` retried every `poll` seconds without blocking the event loop, until
    `time.monotonic()` passes `deadline` (then TimeoutError). `on_wait` runs once, when the
    lock is first found taken (e.g. to log who is waited for)."""
    waited = False

    def attempt() -> IO[str] | None:
        nonlocal waited
        handle = try_flock(path)
        if handle is None and not waited and on_wait is not None:
            on_wait()
        waited = True
        return handle

    if (handle := await poll_until(attempt, deadline, poll)) is None:
        raise TimeoutError(f"timed out waiting for the lock {path}")
    return handle


class Latch:
    """Something that happens once and has a reason (a stack lost, a host told to stop): the
    first `set(reason)` wins, later ones change nothing; `wait()` returns the reason once set.
    Make it where an event loop may be running or not (it binds to the loop that first waits)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.reason = ""

    def set(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> str:
        await self._event.wait()
        return self.reason


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel `tasks` (None ones skipped) and wait until every one has finished, whatever it
    raised: after this, none of them runs any more."""
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
