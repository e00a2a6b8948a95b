"""One NeMo Gym stack per machine for every env process that asks for the same one.

Design (see docs/shared-stacks.md):

- A stack is identified by its *key*: nemo-gym version, the runtime's Python and venv, the
  sorted set of NeMo Gym config files (and their contents), and its judge if any (endpoint,
  model, API and a digest of the key: two judges or two keys never share a stack). Its folder
  `<cache>/stacks/<key>/` (mode 0700) holds `lock` (a flock serialising attach/start/stop
  decisions), `host.sock` (the host's unix socket) and `host.log`.
- The *stack host* is a detached process (`nemo/host.py`, run as `python -m`) that owns
  the `NeMoGymStack` (so the supervisor's teardown applies unchanged) and a small *front*
  forwarder registered as NeMo Gym's `policy_model`. It never runs rollouts.
- Each env process (*user*) keeps its own in-process model proxy (per-rollout routes, stop
  conditions, provider errors stay there) and holds a *lease*: one open connection to
  `host.sock`, on which it registered its proxy's URL and secret. The front forwards a model call
  only to the loopback proxy whose secret the call carries (the secret both authenticates and
  selects the user: rollouts of one user never reach another's proxy, and the user's proxy then
  routes by route id as before).
- The kernel closes a lease when its process dies, SIGKILL included. With no lease left the host
  waits `idle_timeout` seconds, then (under the flock, so no attach can slip in) removes its
  socket, stops the stack and exits. Persistent stacks (`nemo-gym-env stack up`) use the same
  host with a longer (or no) idle timeout.
- `attach_or_start` takes the flock, attaches to a live host or starts one and waits for it:
  concurrent starts bring up exactly one stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from verifiers_nemogym.bridge.judge import Judge, JudgeStatus
from verifiers_nemogym.errors import StackError
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.util import acquire_flock, cache_root, pid_alive

logger = logging.getLogger(__name__)
T = TypeVar("T")

HOST_ENV_VAR = "VF_NEMOGYM_STACK_HOST"
"""Set (to the stack key) in the stack host's environment, so scans can find hosts."""
DEFAULT_IDLE_GRACE = 5.0
"""Seconds an automatically started stack stays up after its last user left."""
_LINE_LIMIT = 1 << 20


# ------------------------------------------------------------------------------ identity


def stacks_root() -> Path:
    """Where every shared stack's folder lives."""
    return cache_root() / "stacks"


def stack_key(
    venv: NeMoGymVenv,
    config_paths: list[Path],
    judge: Judge | None = None,
    judge_key: str | None = None,
) -> str:
    """The identity of a stack: same runtime, same set of config files with the same contents,
    and the same judge (`Judge.identity`: endpoint and a digest of its key) = same stack (an
    edited config starts a stack of its own instead of attaching to one that runs the old file).
    Files a config includes are not followed."""
    files = sorted({Path(p).absolute() for p in config_paths})
    ident: dict[str, Any] = {
        "nemo_gym_version": venv.nemo_gym_version,
        "python_version": venv.python_version,
        "venv": str(venv.venv),
        "config_paths": [str(p) for p in files],
        "config_sha256": [_file_digest(p) for p in files],
    }
    if judge is not None:
        ident["judge"] = judge.identity(judge_key)
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def _file_digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "unreadable"


def stack_dir(key: str) -> Path:
    return stacks_root() / key


def _socket_path(directory: Path) -> Path:
    return directory / "host.sock"


@contextlib.asynccontextmanager
async def stack_lock(directory: Path, deadline: float, what: str) -> AsyncIterator[None]:
    """Hold `directory/lock` (flock) for the block; StackError naming `what` at `deadline`."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        handle = await acquire_flock(directory / "lock", deadline)
    except TimeoutError:
        raise StackError(
            f"timed out waiting for the shared stack lock {directory / 'lock'} ({what})"
        ) from None
    try:
        yield
    finally:
        handle.close()  # drops the flock


# ------------------------------------------------------------------------------ wire


async def _send(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    writer.write(json.dumps(message).encode() + b"\n")
    await writer.drain()


async def _receive(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next JSON line, or None at EOF."""
    line = await reader.readline()
    if not line:
        return None
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("a message must be a JSON object")
    return message


async def request(directory: Path, message: dict[str, Any], timeout: float = 10) -> dict[str, Any]:
    """Send one control message (`status`, `down`) to the host in `directory`; its answer.
    Raises StackError if no host listens there."""
    path = _socket_path(directory)
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_unix_connection(path, limit=_LINE_LIMIT)
            try:
                await _send(writer, message)
                answer = await _receive(reader)
            finally:
                writer.close()
    except (OSError, TimeoutError, ValueError) as e:
        raise StackError(f"no shared NeMo Gym stack answers at {path} ({e!r})") from None
    if answer is None:
        raise StackError(f"the shared NeMo Gym stack at {path} closed without answering")
    return answer


# ------------------------------------------------------------------------------ user side


@dataclass(eq=False)
class Lease:
    """An env process's hold on a shared stack: while it is open the stack stays up.

    `run_urls` (agent -> where its rollouts' `/run` goes) and `head_url` describe the stack;
    `lost` is set (with `reason`) when the host goes away (stack died, `stack down`, host
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
    reason: str = ""
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    judge: JudgeStatus | None = None
    """The stack's judge, kept up to date by the host's `judge_failed` events."""
    _watch: asyncio.Task[None] | None = None

    def begin_watch(self) -> None:
        self._watch = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        reason = "the shared NeMo Gym stack host closed the lease"
        try:
            while (message := await _receive(self._reader)) is not None:
                if message.get("event") == "judge_failed" and self.judge is not None:
                    self.judge.failed(str(message.get("message")), float(message["at"]))
                elif message.get("event") == "down":
                    reason = f"the shared NeMo Gym stack went down: {message.get('reason')}"
        except (OSError, ValueError) as e:
            reason = f"lost the shared NeMo Gym stack host ({e!r})"
        self.reason = reason
        self.lost.set()

    async def close(self) -> None:
        if self._watch is not None:
            watch, self._watch = self._watch, None
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        if not self._writer.is_closing():
            self._writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await self._writer.wait_closed()


async def _try_lease(directory: Path, proxy_url: str, proxy_secret: str) -> Lease | None:
    """A lease from the host listening in `directory`, or None if none listens (or it is
    shutting down)."""
    path = _socket_path(directory)
    if not path.exists():
        return None
    try:
        reader, writer = await asyncio.open_unix_connection(path, limit=_LINE_LIMIT)
    except OSError:
        return None
    try:
        hello = {"op": "lease", "pid": os.getpid(), "proxy_url": proxy_url, "secret": proxy_secret}
        await _send(writer, hello)
        async with asyncio.timeout(30):
            answer = await _receive(reader)
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


@dataclass(frozen=True)
class HostSpec:
    """What a stack host starts: passed to the host program (`nemo/host.py`) as JSON."""

    nemo_gym_version: str
    python: str
    config_paths: list[str]
    idle_timeout: float | None
    start_timeout: float
    persistent: bool = False
    below_floor: bool = False
    """The runtime was built below its release's declared Python floor (the explicit opt-in)."""
    judge: dict[str, Any] | None = None
    """The stack's judge (`Judge.to_dict`: no key; the key reaches the host on its stdin)."""

    @classmethod
    def of(
        cls,
        venv: NeMoGymVenv,
        config_paths: list[Path],
        idle_timeout: float | None,
        start_timeout: float,
        *,
        persistent: bool = False,
        judge: Judge | None = None,
    ) -> HostSpec:
        """The spec of a host serving `config_paths` on `venv`'s release and Python."""
        return cls(
            nemo_gym_version=venv.nemo_gym_version,
            python=str(venv.python),
            config_paths=[str(Path(p).absolute()) for p in config_paths],
            idle_timeout=idle_timeout,
            start_timeout=start_timeout,
            persistent=persistent,
            below_floor=venv.below_floor,
            judge=judge.to_dict() if judge is not None else None,
        )

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> HostSpec:
        return cls(**json.loads(text))


def spawn_host(
    directory: Path, spec: HostSpec, judge: Judge | None = None, judge_key: str | None = None
) -> subprocess.Popen[bytes]:
    """Start a detached stack host for `directory` (its output goes to `host.log`). The caller
    holds the stack lock and has checked that no host listens. The judge's key and headers go to
    the host on its stdin (one JSON line), never in its arguments or environment."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileNotFoundError):
        _socket_path(directory).unlink()  # a killed host's leftover
    env = {**os.environ, HOST_ENV_VAR: directory.name}
    if spec.judge is not None and spec.judge.get("key_var"):
        env.pop(str(spec.judge["key_var"]), None)
    # Imported here: the host module builds on this one (the lease protocol, HostSpec).
    from verifiers_nemogym.nemo import host

    with (directory / "host.log").open("ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                host.__name__,
                "--dir",
                str(directory),
                "--spec",
                spec.to_json(),
            ],
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
        headers = judge.headers if judge is not None else {}
        secrets = {"judge_key": judge_key, "judge_headers": headers}
        proc.stdin.write(json.dumps(secrets).encode() + b"\n")
        proc.stdin.close()
    return proc


def _log_tail(directory: Path, n: int = 30) -> str:
    try:
        lines = (directory / "host.log").read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


async def wait_for_host(
    directory: Path,
    proc: subprocess.Popen[bytes],
    deadline: float,
    proxy_url: str,
    proxy_secret: str,
) -> Lease:
    """Wait until the host `proc` serves `directory`, then take a lease (see `_await_host`)."""
    return await _await_host(
        directory, proc, deadline, lambda: _try_lease(directory, proxy_url, proxy_secret)
    )


async def _await_host(
    directory: Path,
    proc: subprocess.Popen[bytes],
    deadline: float,
    ready: Callable[[], Awaitable[T | None]],
) -> T:
    """Poll `ready()` until it gives a value. A host that exits first or misses `deadline` is a
    StackError with its log tail (a late one is told to stop, which stops its stack, first)."""
    while True:
        if (code := proc.poll()) is not None:
            raise StackError(
                f"the shared NeMo Gym stack host exited with status {code} before it was ready; "
                f"log tail ({directory / 'host.log'}):\n{_log_tail(directory)}"
            )
        if (value := await ready()) is not None:
            return value
        if time.monotonic() > deadline:
            proc.send_signal(signal.SIGTERM)  # it stops its stack before exiting
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(proc.wait, 60)
            raise StackError(
                f"the shared NeMo Gym stack was not ready in time; log tail "
                f"({directory / 'host.log'}):\n{_log_tail(directory)}"
            )
        await asyncio.sleep(0.2)


async def attach_or_start(
    venv: NeMoGymVenv,
    config_paths: list[Path],
    *,
    proxy_url: str,
    proxy_secret: str,
    idle_timeout: float = DEFAULT_IDLE_GRACE,
    start_timeout: float = 900,
    judge: Judge | None = None,
    judge_key: str | None = None,
    log: logging.Logger = logger,
) -> Lease:
    """A lease on the shared stack for `config_paths` on `venv`, started if none runs.

    The proxy at `proxy_url` (loopback) receives every model call NeMo Gym makes that carries
    `proxy_secret`. Starts are serialised by the stack's flock: exactly one host starts a stack.
    """
    began = time.monotonic()
    deadline = began + start_timeout + 60
    directory = stack_dir(stack_key(venv, config_paths, judge, judge_key))
    async with stack_lock(directory, deadline, "attach or start"):
        lease = await _try_lease(directory, proxy_url, proxy_secret)
        if lease is None:
            spec = HostSpec.of(venv, config_paths, idle_timeout, start_timeout, judge=judge)
            proc = spawn_host(directory, spec, judge, judge_key)
            log.info(
                "starting NeMo Gym stack (shared, host pid %d: %s), log: %s",
                proc.pid,
                ", ".join(Path(p).name for p in config_paths),
                directory / "host.log",
            )
            lease = await wait_for_host(directory, proc, deadline, proxy_url, proxy_secret)
            lease.started = True
    lease.begin_watch()
    return lease


# ------------------------------------------------------------------------------ host side


@dataclass
class HostInfo:
    """One shared stack as `stack status` reports it."""

    directory: Path
    status: dict[str, Any] | None
    error: str = ""


async def list_hosts() -> list[HostInfo]:
    """Every stack folder with a host socket, and what its host answers."""
    found: list[HostInfo] = []
    root = stacks_root()
    if not root.is_dir():
        return found
    for directory in sorted(root.iterdir()):
        if not _socket_path(directory).exists():
            continue
        try:
            found.append(HostInfo(directory, await request(directory, {"op": "status"})))
        except StackError as e:
            found.append(HostInfo(directory, None, str(e)))
    return found


async def bring_up(
    venv: NeMoGymVenv,
    config_paths: list[Path],
    *,
    idle_timeout: float | None,
    start_timeout: float = 900,
    judge: Judge | None = None,
    judge_key: str | None = None,
) -> dict[str, Any]:
    """`stack up`: a persistent stack for `config_paths` (started, or an automatic one made
    persistent) that stays until `stack down` or `idle_timeout` seconds without users
    (None: no limit). Returns its status."""
    deadline = time.monotonic() + start_timeout + 60
    directory = stack_dir(stack_key(venv, config_paths, judge, judge_key))
    async with stack_lock(directory, deadline, "stack up"):
        if not _socket_path(directory).exists() or not await _answers(directory):
            spec = HostSpec.of(
                venv, config_paths, idle_timeout, start_timeout, persistent=True, judge=judge
            )
            proc = spawn_host(directory, spec, judge, judge_key)

            async def answering() -> bool | None:
                return await _answers(directory) or None

            await _await_host(directory, proc, deadline, answering)
        return await request(directory, {"op": "persist", "idle_timeout": idle_timeout})


async def _answers(directory: Path) -> bool:
    try:
        return bool((await request(directory, {"op": "status"}, timeout=5)).get("ok"))
    except StackError:
        return False


async def take_down(directory: Path, timeout: float = 60) -> int:
    """`stack down` for the host in `directory`: ask it to stop and wait until it has exited
    (its stack stopped with it). Returns the host's pid."""
    answer = await request(directory, {"op": "down"})
    pid = int(answer["pid"])
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            raise StackError(f"the NeMo Gym stack host (pid {pid}) did not stop in {timeout:g} s")
        await asyncio.sleep(0.2)
    return pid
