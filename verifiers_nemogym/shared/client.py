"""The client side of the shared stack: an env process's lease (`Lease`, `attach_or_start`), the
stack key (`stack_key`: runtime, config files and contents, judge, Ray) and the
`stack up/status/down` commands. Concurrent starts bring up exactly one host; a host that holds
`host.lock` but does not answer yet is waited for, never replaced. The protocol is
`shared/protocol.py`; the design docs/shared-stacks.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

from verifiers_nemogym.errors import StackError
from verifiers_nemogym.judge.blame import JudgeStatus
from verifiers_nemogym.judge.endpoint import Judge
from verifiers_nemogym.nemo import supervisor as procs
from verifiers_nemogym.nemo.ray_cluster import TOKEN_VAR, RayCluster, check_cluster
from verifiers_nemogym.nemo.venv import NeMoGymVenv, packages_digest
from verifiers_nemogym.shared import protocol
from verifiers_nemogym.shared.protocol import HOST_ENV_VAR, HostSpec, check_idle_timeout, request
from verifiers_nemogym.util import (
    Latch,
    acquire_flock,
    cache_root,
    cancel_and_wait,
    open_nofollow,
    poll_until,
    private_dir,
    try_flock,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_IDLE_GRACE = 5.0
"""Seconds an automatically started stack stays up after its last user left."""
LEASE_ANSWER_TIMEOUT = 30.0
"""Seconds a user waits for a host's answer to its lease hello before asking again."""


# ------------------------------------------------------------------------------ identity


STACKS_ENV_VAR = "VF_NEMOGYM_STACKS"
"""A folder for the shared stacks' folders other than `<cache>/stacks`: env processes share a
stack only when they see the same one, so processes that must not share (two experiments, or
the test suite's parallel workers) keep apart while sharing the runtimes and server venvs."""


def stacks_root() -> Path:
    """Where every shared stack's folder lives: `$VF_NEMOGYM_STACKS`, else `<cache>/stacks`."""
    if explicit := os.environ.get(STACKS_ENV_VAR):
        return Path(explicit).expanduser()
    return cache_root() / "stacks"


def stack_key(
    venv: NeMoGymVenv,
    config_paths: list[Path],
    judge: Judge | None = None,
    ray: RayCluster | None = None,
    allow_unisolated_containers: bool = False,
    sandbox_packages: Sequence[str] = (),
) -> str:
    """The identity of a stack: same runtime, same set of config files with the same contents,
    the same judge (`Judge.identity`: endpoint and a digest of its key), the same Ray (the
    stack's private one, or the cluster at one address) and the same consent to unisolated
    containers, and the same `sandbox_packages` (`NeMoGymVenv.server_venvs_for`'s digest:
    the lines and the local packages' contents) = same stack (an edited config starts a
    stack of its own instead of attaching to one that runs the old file). Files a config
    includes are not followed."""
    files = sorted({Path(p).absolute() for p in config_paths})
    ident: dict[str, Any] = {
        "nemo_gym_version": venv.nemo_gym_version,
        "python_version": venv.python_version,
        "venv": str(venv.venv),
        "config_paths": [str(p) for p in files],
        "config_sha256": [_file_digest(p) for p in files],
    }
    if judge is not None:
        ident["judge"] = judge.identity()
    if ray is not None:
        ident["ray_address"] = ray.address  # absent for a private Ray: existing keys stay
    if allow_unisolated_containers:  # a user who did not opt in never attaches to such a stack
        ident["allow_unisolated_containers"] = True
    if sandbox_packages:  # absent without them: existing keys stay
        ident["sandbox_packages"] = packages_digest(sandbox_packages)
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def _file_digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "unreadable"


def stack_dir(key: str) -> Path:
    return stacks_root() / key


def check_stack_dir(directory: Path) -> None:
    """Before anything starts: the cache root, `stacks/` and `directory` are ours and private
    (else ConfigError, see `util.private_dir`), and `host.sock` fits a unix socket address
    (else StackError naming the path)."""
    private_dir(cache_root())
    private_dir(directory.parent)
    private_dir(directory)
    path = directory / protocol.SOCKET
    if len(os.fsencode(path)) > protocol.SOCKET_PATH_MAX:
        raise StackError(
            f"the shared stack socket path {path} is longer than {protocol.SOCKET_PATH_MAX} bytes; "
            "set VF_NEMOGYM_CACHE to a shorter folder"
        )


def spawn_if_no_host(
    directory: Path, spec: HostSpec, judge: Judge | None = None, ray: RayCluster | None = None
) -> subprocess.Popen[bytes] | None:
    """Under the stack lock: a new host for `directory` if none runs (None if one does). The
    new host inherits our flock on `host.lock` (the same open file), so there is no moment in
    which the lock is free while it starts, even if we are killed right after."""
    handle = try_flock(directory / protocol.HOST_LOCK)
    if handle is None:
        return None
    with handle:
        return spawn_host(directory, spec, handle, judge, ray)


async def check_ray(venv: NeMoGymVenv, ray: RayCluster | None) -> None:
    """Before a host is asked or spawned: the Ray cluster a stack is to join answers and takes
    us (`ray_cluster.check_cluster`: a one-line StackError in bounded time otherwise)."""
    if ray is None:
        return
    folder = Path(tempfile.mkdtemp(prefix="vfng-", dir="/tmp"))  # 0700: a token file may go here
    try:
        await check_cluster(venv.bin("python"), ray, venv.env(folder), folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.asynccontextmanager
async def stack_lock(directory: Path, deadline: float, what: str) -> AsyncIterator[None]:
    """Hold `directory/lock` (flock) for the block; StackError naming `what` at `deadline`.
    The folder is checked first (`check_stack_dir`)."""
    check_stack_dir(directory)
    path = directory / protocol.LOCK
    try:
        handle = await acquire_flock(path, deadline)
    except TimeoutError:
        raise StackError(f"timed out waiting for the shared stack lock {path} ({what})") from None
    except OSError as e:  # e.g. ELOOP: `lock` is a symlink, which is never followed
        raise StackError(f"cannot open the shared stack lock {path}: {e}") from None
    try:
        yield
    finally:
        handle.close()  # drops the flock


# ------------------------------------------------------------------------------ user side


@dataclass(eq=False)
class Lease:
    """An env process's hold on a shared stack: while it is open the stack stays up.

    `run_urls` (agent -> where its rollouts' `/run` goes) and `head_url` describe the stack;
    `lost` is set, with its reason, when the host goes away (stack died, `stack down`, host
    killed). `close()` is idempotent."""

    directory: Path
    run_urls: dict[str, str]
    head_url: str
    marker: str
    host_pid: int
    started: bool
    """Whether this process started the host (else it attached to a running one)."""
    _reader: asyncio.StreamReader
    _writer: asyncio.StreamWriter
    lost: Latch = field(default_factory=Latch)
    judge: JudgeStatus | None = None
    """The stack's judge, kept up to date by the host's `judge_failed` events."""
    _watch: asyncio.Task[None] | None = None

    def begin_watch(self) -> None:
        self._watch = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        reason = "the shared NeMo Gym stack host closed the lease"
        try:
            while (message := await protocol.receive(self._reader)) is not None:
                if (down := protocol.take_event(message, self.judge)) is not None:
                    reason = f"the shared NeMo Gym stack went down: {down}"
        except (OSError, ValueError, KeyError) as e:
            reason = f"lost the shared NeMo Gym stack host ({e!r})"
        self.lost.set(reason)

    async def close(self) -> None:
        watch, self._watch = self._watch, None
        await cancel_and_wait(watch)
        if not self._writer.is_closing():
            # shutdown, not just close: a child forked after attaching shares the socket, and a
            # close would leave the connection open (and the host counting us) while it lives.
            sock = self._writer.get_extra_info("socket")
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            self._writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await self._writer.wait_closed()


async def _try_lease(directory: Path, proxy_url: str, proxy_secret: str) -> Lease | None:
    """A lease from the host listening in `directory`, or None if none answers in
    `LEASE_ANSWER_TIMEOUT` s (or it is shutting down). StackError, before the secret is sent,
    if the listener is another user's."""
    path = directory / protocol.SOCKET
    if not path.exists():
        return None
    try:
        reader, writer = await protocol.connect(path)
    except OSError:
        return None
    try:
        await protocol.send(writer, protocol.lease_hello(proxy_url, proxy_secret))
        async with asyncio.timeout(LEASE_ANSWER_TIMEOUT):
            answer = await protocol.receive(reader)
    except (OSError, TimeoutError, ValueError):
        writer.close()
        return None
    if not answer or not answer.get("ok"):
        writer.close()
        return None
    judge = answer.get("judge")
    return Lease(
        directory=directory,
        run_urls=dict(answer["run_urls"]),
        head_url=str(answer["head_url"]),
        marker=str(answer["marker"]),
        host_pid=int(answer["pid"]),
        started=False,
        judge=JudgeStatus(dict(judge)) if isinstance(judge, dict) else None,
        _reader=reader,
        _writer=writer,
    )


def host_spec(
    venv: NeMoGymVenv,
    config_paths: list[Path],
    idle_timeout: float | None,
    start_timeout: float,
    *,
    persistent: bool = False,
    judge: Judge | None = None,
    ray: RayCluster | None = None,
    allow_unisolated_containers: bool = False,
    sandbox_packages: Sequence[str] = (),
) -> HostSpec:
    """The spec of a host serving `config_paths` on `venv`'s release and Python."""
    return HostSpec(
        nemo_gym_version=venv.nemo_gym_version,
        python=str(venv.python),
        config_paths=[str(Path(p).absolute()) for p in config_paths],
        idle_timeout=idle_timeout,
        start_timeout=start_timeout,
        persistent=persistent,
        below_floor=venv.below_floor,
        judge=judge.to_dict() if judge is not None else None,
        ray=ray.to_dict() if ray is not None else None,
        allow_unisolated_containers=allow_unisolated_containers,
        sandbox_packages=list(sandbox_packages),
    )


def spawn_host(
    directory: Path,
    spec: HostSpec,
    host_lock: IO[str],
    judge: Judge | None = None,
    ray: RayCluster | None = None,
) -> subprocess.Popen[bytes]:
    """Start a detached stack host for `directory` (its output goes to `host.log`; the previous
    host's log is kept as `host.log.1`, so logs do not grow forever). The caller holds the stack
    lock and `host_lock` (`host.lock`, flocked), which the host inherits and keeps for its life;
    the host itself removes a dead host's socket. The judge's secrets (`protocol.host_secrets`) go
    to the host on its stdin (one JSON line), never in its arguments or environment; so does a
    Ray cluster's token given by value (`RAY_AUTH_TOKEN`)."""
    log_path = directory / protocol.LOG
    with contextlib.suppress(FileNotFoundError):
        os.replace(log_path, directory / protocol.PREVIOUS_LOG)
    env = {**os.environ, HOST_ENV_VAR: directory.name}
    env.pop(TOKEN_VAR, None)
    if judge is not None:
        env = judge.scrubbed(env)
    with open_nofollow(log_path, binary=True) as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                protocol.HOST_MODULE,
                "--dir",
                str(directory),
                "--spec",
                spec.to_json(),
                "--lock-fd",
                str(host_lock.fileno()),
            ],
            pass_fds=(host_lock.fileno(),),
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            # Its own session: a Ctrl-C to the user's terminal is not the stack's business; it
            # stops when its last user is gone.
            start_new_session=True,
        )
    assert proc.stdin is not None
    with contextlib.suppress(OSError):  # a host that died at once says why in its log
        proc.stdin.write(json.dumps(protocol.host_secrets(judge, ray)).encode() + b"\n")
        proc.stdin.close()
    return proc


def _log_tail(directory: Path, n: int = 30) -> str:
    try:
        lines = (directory / protocol.LOG).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


async def _host_or_start(
    directory: Path,
    spec: HostSpec,
    deadline: float,
    ready: Callable[[], Awaitable[T | None]],
    log: logging.Logger,
    judge: Judge | None = None,
    ray: RayCluster | None = None,
) -> tuple[T, bool]:
    """Under the stack lock: poll `ready()` until the stack's host gives a value (any truthy
    one); returns it and whether this call spawned the host.

    A host is spawned only when none runs (`host.lock` free): one that is still starting or
    answers slowly is waited for, so there is never a second host. A host we spawned that exits
    first, or any wait past `deadline`, is a StackError with the log tail (a late host we
    spawned is told to stop, which stops its stack, first)."""
    proc: subprocess.Popen[bytes] | None = None
    waiting_logged = False

    async def attempt() -> T | None:
        nonlocal proc, waiting_logged
        if (value := await ready()) is not None:
            return value
        if proc is not None and (code := proc.poll()) is not None:
            raise StackError(
                f"the shared NeMo Gym stack host exited with status {code} before it was ready; "
                f"log tail ({directory / protocol.LOG}):\n{_log_tail(directory)}"
            )
        if proc is None and (proc := spawn_if_no_host(directory, spec, judge, ray)) is not None:
            log.info(
                "starting NeMo Gym stack (shared, host pid %d: %s), log: %s",
                proc.pid,
                ", ".join(Path(p).name for p in spec.config_paths),
                directory / protocol.LOG,
            )
        elif proc is None and not waiting_logged:
            waiting_logged = True
            log.info("waiting for the shared NeMo Gym stack host of %s to answer", directory)
        return None

    value: T | None = await poll_until(attempt, deadline, 0.2)
    if value is not None:
        return value, proc is not None
    if proc is not None:
        proc.send_signal(signal.SIGTERM)  # it stops its stack before exiting
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(proc.wait, 60)
    raise StackError(
        f"the shared NeMo Gym stack was not ready in time; log tail "
        f"({directory / protocol.LOG}):\n{_log_tail(directory)}"
    )


async def attach_or_start(
    venv: NeMoGymVenv,
    config_paths: list[Path],
    *,
    proxy_url: str,
    proxy_secret: str,
    idle_timeout: float = DEFAULT_IDLE_GRACE,
    start_timeout: float = 900,
    judge: Judge | None = None,
    ray: RayCluster | None = None,
    allow_unisolated_containers: bool = False,
    sandbox_packages: Sequence[str] = (),
    log: logging.Logger = logger,
) -> Lease:
    """A lease on the shared stack for `config_paths` on `venv`, started if none runs.

    The proxy at `proxy_url` (loopback) receives every model call NeMo Gym makes that carries
    `proxy_secret`. Starts are serialised by the stack's flock and a host's `host.lock`:
    at most one host runs per stack, whoever is cancelled or killed when. The stack folder is
    checked before anything is sent (`check_stack_dir`: ConfigError or StackError), and so is
    `ray`, the user's Ray cluster the stack joins (`check_ray`).
    """
    deadline = time.monotonic() + start_timeout + 60
    key = stack_key(venv, config_paths, judge, ray, allow_unisolated_containers, sandbox_packages)
    directory = stack_dir(key)
    spec = host_spec(
        venv, config_paths, idle_timeout, start_timeout, judge=judge, ray=ray,
        allow_unisolated_containers=allow_unisolated_containers,
        sandbox_packages=sandbox_packages,
    )  # fmt: skip
    check_stack_dir(directory)
    await check_ray(venv, ray)
    async with stack_lock(directory, deadline, "attach or start"):
        held, started = await _host_or_start(
            directory,
            spec,
            deadline,
            lambda: _try_lease(directory, proxy_url, proxy_secret),
            log,
            judge,
            ray,
        )
        held.started = started
    held.begin_watch()
    return held


# ------------------------------------------------------------------------------ host side


@dataclass
class HostInfo:
    """One shared stack as `stack status` reports it; `status` is None (and `error` says why)
    for a host that does not answer, e.g. one that is still starting; `pid` is the host's
    process when known."""

    directory: Path
    status: dict[str, Any] | None
    error: str = ""
    pid: int | None = None


def host_processes() -> dict[Path, int]:
    """Stack host processes of this uid serving folders under `stacks_root()`, found by their
    marker (`HOST_ENV_VAR`) and command line: folder -> pid. Finds hosts that do not answer
    on their socket (starting, wedged, or a socket lost)."""
    found: dict[Path, int] = {}
    root = stacks_root().absolute()
    for pid in procs.pids():
        if procs.uid_of(pid) != os.getuid() or procs.env_value(pid, HOST_ENV_VAR) is None:
            continue
        argv = procs.argv_of(pid)
        # The host's children inherit the marker, but run other programs.
        if protocol.HOST_MODULE not in argv or "--dir" not in argv[:-1]:
            continue
        directory = Path(argv[argv.index("--dir") + 1]).absolute()
        if directory.parent == root:
            found[directory] = pid
    return found


async def list_hosts() -> list[HostInfo]:
    """Every stack host of this uid here: each stack folder with a host socket, and what its
    host answers, plus every host process no socket leads to (see `host_processes`)."""
    found: list[HostInfo] = []
    root = stacks_root()
    processes = host_processes()
    if root.is_dir():
        for directory in sorted(root.iterdir()):
            if not (directory / protocol.SOCKET).exists():
                continue
            try:
                status = await protocol.status(directory)
            except StackError as e:
                found.append(HostInfo(directory, None, str(e)))
                continue
            found.append(HostInfo(directory, status, pid=int(status["pid"])))
    known = {h.pid for h in found if h.pid is not None}
    for directory, pid in sorted(processes.items()):
        if pid not in known:
            found.append(
                HostInfo(directory, None, f"host pid {pid} runs but does not answer", pid=pid)
            )
    return found


async def bring_up(
    venv: NeMoGymVenv,
    config_paths: list[Path],
    *,
    idle_timeout: float | None,
    start_timeout: float = 900,
    judge: Judge | None = None,
    listen: str | None = None,
    ray: RayCluster | None = None,
    allow_unisolated_containers: bool = False,
) -> dict[str, Any]:
    """`stack up`: a persistent stack for `config_paths` (started, or an automatic one made
    persistent) that stays until `stack down` or `idle_timeout` seconds without users
    (None: no limit; else finite and >= 0, or StackError), its servers in the Ray cluster `ray`
    when given (`check_ray` first). `listen` (`HOST:PORT`): the host also serves env processes
    on other hosts there, with TLS (`shared/gate.py`); StackError if it cannot. Returns its
    status (with `listen`: the URL, the certificate's pin, the token's file)."""
    check_idle_timeout(idle_timeout)
    deadline = time.monotonic() + start_timeout + 60
    directory = stack_dir(stack_key(venv, config_paths, judge, ray, allow_unisolated_containers))
    spec = host_spec(
        venv, config_paths, idle_timeout, start_timeout, persistent=True, judge=judge, ray=ray,
        allow_unisolated_containers=allow_unisolated_containers,
    )  # fmt: skip
    check_stack_dir(directory)
    await check_ray(venv, ray)
    async with stack_lock(directory, deadline, "stack up"):

        async def answering() -> bool | None:
            return await _host_answers(directory) or None

        await _host_or_start(directory, spec, deadline, answering, logger, judge, ray)
        message = {"op": protocol.OP_PERSIST, "idle_timeout": idle_timeout, "listen": listen}
        answer = await request(directory, message)
        if not answer.get("ok"):
            raise StackError(f"the shared stack host refused: {answer.get('error')}")
        return answer


async def _host_answers(directory: Path) -> bool:
    """Whether the host in `directory` answers a status request, ready."""
    try:
        return bool((await protocol.status(directory, timeout=5)).get("ok"))
    except StackError:
        return False


async def take_down(directory: Path, timeout: float = 60, pid: int | None = None) -> int:
    """`stack down` for the host in `directory`: ask it to stop (or, for a host process `pid`
    that does not answer, SIGTERM it) and wait until it has exited (its stack stopped with it).
    Returns the host's pid."""
    if pid is None:
        answer = await request(directory, {"op": protocol.OP_DOWN})
        pid = int(answer["pid"])
    else:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)  # the host stops its stack (or its start) first
    if not await poll_until(lambda: not procs.alive(pid), time.monotonic() + timeout, 0.2):
        raise StackError(f"the NeMo Gym stack host (pid {pid}) did not stop in {timeout:g} s")
    return pid
