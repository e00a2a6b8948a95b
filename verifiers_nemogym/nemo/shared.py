"""One NeMo Gym stack per machine for every env process that asks for the same one.

Design (see docs/shared-stacks.md):

- A stack is identified by its *key*: nemo-gym version, the runtime's Python and venv, and the
  sorted set of NeMo Gym config files. Its folder `<cache>/stacks/<key>/` (mode 0700) holds
  `lock` (a flock serialising attach/start/stop decisions), `host.sock` (the host's unix socket)
  and `host.log`.
- The *stack host* is a detached process (`python -m verifiers_nemogym.cli.stack_host`) that owns
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
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from verifiers_nemogym.bridge.front import FrontForwarder, FrontUser, secret_digest
from verifiers_nemogym.errors import StackError
from verifiers_nemogym.nemo.stack import NeMoGymStack
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.net import LOOPBACK
from verifiers_nemogym.util import cache_root

logger = logging.getLogger(__name__)

HOST_ENV_VAR = "VF_NEMOGYM_STACK_HOST"
"""Set (to the stack key) in the stack host's environment, so scans can find hosts."""
DEFAULT_IDLE_GRACE = 5.0
"""Seconds an automatically started stack stays up after its last user left."""
_LINE_LIMIT = 1 << 20
_HOST_MODULE = "verifiers_nemogym.cli.stack_host"


# ------------------------------------------------------------------------------ identity


def stacks_root() -> Path:
    """Where every shared stack's folder lives."""
    return cache_root() / "stacks"


def stack_key(venv: NeMoGymVenv, config_paths: list[Path]) -> str:
    """The identity of a stack: same runtime and same set of config files = same stack."""
    ident = {
        "nemo_gym_version": venv.nemo_gym_version,
        "python_version": venv.python_version,
        "venv": str(venv.venv),
        "config_paths": sorted({str(Path(p).absolute()) for p in config_paths}),
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def stack_dir(key: str) -> Path:
    return stacks_root() / key


def _socket_path(directory: Path) -> Path:
    return directory / "host.sock"


@contextlib.asynccontextmanager
async def stack_lock(directory: Path, deadline: float, what: str) -> AsyncIterator[None]:
    """Hold `directory/lock` (flock) for the block; StackError naming `what` at `deadline`."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    handle = (directory / "lock").open("a")
    try:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StackError(
                        f"timed out waiting for the shared stack lock {directory / 'lock'} ({what})"
                    ) from None
                await asyncio.sleep(0.1)
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
    _watch: asyncio.Task[None] | None = None

    def begin_watch(self) -> None:
        self._watch = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        reason = "the shared NeMo Gym stack host closed the lease"
        try:
            while (message := await _receive(self._reader)) is not None:
                if message.get("event") == "down":
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
    return Lease(
        directory=directory,
        run_urls=dict(answer["run_urls"]),
        head_url=str(answer["head_url"]),
        marker=str(answer["marker"]),
        host_pid=int(answer["pid"]),
        started=False,
        _reader=reader,
        _writer=writer,
    )


@dataclass(frozen=True)
class HostSpec:
    """What a stack host starts: passed to `python -m verifiers_nemogym.cli.stack_host`."""

    nemo_gym_version: str
    python: str
    config_paths: list[str]
    idle_timeout: float | None
    start_timeout: float
    persistent: bool = False
    below_floor: bool = False
    """The runtime was built below its release's declared Python floor (the explicit opt-in)."""

    @classmethod
    def of(
        cls,
        venv: NeMoGymVenv,
        config_paths: list[Path],
        idle_timeout: float | None,
        start_timeout: float,
        *,
        persistent: bool = False,
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
        )

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> HostSpec:
        return cls(**json.loads(text))


def spawn_host(directory: Path, spec: HostSpec) -> subprocess.Popen[bytes]:
    """Start a detached stack host for `directory` (its output goes to `host.log`). The caller
    holds the stack lock and has checked that no host listens."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileNotFoundError):
        _socket_path(directory).unlink()  # a killed host's leftover
    env = {**os.environ, HOST_ENV_VAR: directory.name}
    with (directory / "host.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", _HOST_MODULE, "--dir", str(directory), "--spec", spec.to_json()],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            # Its own session: a Ctrl-C to the user's terminal is not the stack's business; it
            # stops when its last user is gone.
            start_new_session=True,
        )


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
    """Wait until the host `proc` serves `directory`, then take a lease. A host that exits first
    or misses `deadline` is a StackError with its log tail (a late one is stopped first)."""
    while True:
        if (code := proc.poll()) is not None:
            raise StackError(
                f"the shared NeMo Gym stack host exited with status {code} before it was ready; "
                f"log tail ({directory / 'host.log'}):\n{_log_tail(directory)}"
            )
        if (lease := await _try_lease(directory, proxy_url, proxy_secret)) is not None:
            return lease
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
    log: logging.Logger = logger,
) -> Lease:
    """A lease on the shared stack for `config_paths` on `venv`, started if none runs.

    The proxy at `proxy_url` (loopback) receives every model call NeMo Gym makes that carries
    `proxy_secret`. Starts are serialised by the stack's flock: exactly one host starts a stack.
    """
    began = time.monotonic()
    deadline = began + start_timeout + 60
    directory = stack_dir(stack_key(venv, config_paths))
    async with stack_lock(directory, deadline, "attach or start"):
        lease = await _try_lease(directory, proxy_url, proxy_secret)
        if lease is None:
            spec = HostSpec.of(venv, config_paths, idle_timeout, start_timeout)
            proc = spawn_host(directory, spec)
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


class StackHost:
    """The stack host process's work: front + stack + lease socket, until idle or told down.

    `run()` returns once everything it started is stopped. Leases are connections to the socket;
    control messages: `{"op": "lease", ...}` (held open), `{"op": "status"}`, `{"op": "down"}`.
    """

    def __init__(self, venv: NeMoGymVenv, directory: Path, spec: HostSpec) -> None:
        self.venv = venv
        self.directory = directory
        self.spec = spec
        self.front = FrontForwarder()
        self.stack: NeMoGymStack | None = None
        self.leases: dict[asyncio.StreamWriter, FrontUser] = {}
        self.idle_since = time.monotonic()
        self.started_at = time.time()
        self.leases_total = 0
        self._stopping = asyncio.Event()
        self._stop_reason = ""
        self._server: asyncio.AbstractServer | None = None

    def request_stop(self, reason: str) -> None:
        if not self._stopping.is_set():
            self._stop_reason = reason
            self._stopping.set()

    async def run(self) -> None:
        try:
            await self.front.start()
            self.stack = NeMoGymStack(
                self.venv,
                [Path(p) for p in self.spec.config_paths],
                policy_host=self.front.host,
                policy_port=self.front.port,
                start_timeout=self.spec.start_timeout,
            )
            await self.stack.start()
            # Listening last: a user that can connect finds a ready stack.
            self._server = await asyncio.start_unix_server(
                self._serve, path=_socket_path(self.directory), limit=_LINE_LIMIT
            )
            os.chmod(_socket_path(self.directory), 0o600)
            self.idle_since = time.monotonic()
            logger.info("shared stack ready; agents: %s", ", ".join(sorted(self.stack.agents)))
            await self._supervise()
        finally:
            await self._shutdown()

    async def _supervise(self) -> None:
        last_check = time.monotonic()
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 0.5)
            now = time.monotonic()
            if self.stack is not None and now - last_check >= 2.0:
                last_check = now
                try:
                    await self.stack.check_alive()
                except StackError as e:
                    self.request_stop(f"the stack died: {e}")
            timeout = self.spec.idle_timeout
            idle = not self.leases and timeout is not None and now - self.idle_since >= timeout
            if idle and await self._close_if_still_idle():
                self.request_stop(f"no user for {timeout:g} s")

    async def _close_if_still_idle(self) -> bool:
        """Under the flock, so no user can be attaching meanwhile: stop listening if idle."""
        try:
            handle = (self.directory / "lock").open("a")
        except OSError:
            return True
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # someone is attaching; look again later
            if self.leases:
                return False
            self._stop_listening()
            return True
        finally:
            handle.close()

    def _stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            _socket_path(self.directory).unlink()

    def status(self) -> dict[str, Any]:
        assert self.stack is not None
        return {
            "ok": True,
            "pid": os.getpid(),
            "key": self.directory.name,
            "nemo_gym_version": self.venv.nemo_gym_version,
            "python_version": self.venv.python_version,
            "config_paths": self.spec.config_paths,
            "head_url": self.stack.head_url,
            "run_urls": dict(self.stack.run_urls),
            "marker": self.stack.marker,
            "users": len(self.leases),
            "user_pids": sorted(u.pid for u in self.leases.values()),
            "leases_total": self.leases_total,
            "model_calls": self.front.calls,
            "idle_timeout": self.spec.idle_timeout,
            "persistent": self.spec.persistent,
            "uptime_s": round(time.time() - self.started_at, 1),
            "log": str(self.directory / "host.log"),
        }

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        user: FrontUser | None = None
        try:
            message = await _receive(reader)
            if message is None:
                return
            op = message.get("op")
            if self._stopping.is_set():
                await _send(writer, {"ok": False, "error": "shutting down"})
            elif op == "status":
                await _send(writer, self.status())
            elif op == "persist":
                # `stack up` on a running stack: keep it until down or the new idle timeout.
                timeout = message.get("idle_timeout")
                self.spec = dataclasses.replace(
                    self.spec,
                    persistent=True,
                    idle_timeout=None if timeout is None else float(timeout),
                )
                self.idle_since = time.monotonic()
                await _send(writer, self.status())
            elif op == "down":
                self.request_stop("stack down requested")
                await _send(writer, {"ok": True, "pid": os.getpid()})
            elif op == "lease":
                user = FrontUser(
                    pid=int(message["pid"]),
                    proxy_url=_loopback_url(str(message["proxy_url"])),
                    secret_digest=secret_digest(str(message["secret"])),
                )
                self.front.add(user)
                self.leases[writer] = user
                self.leases_total += 1
                answer = self.status()
                await _send(writer, answer)
                logger.info("user pid %d attached (%d users)", user.pid, len(self.leases))
                while await reader.read(4096):  # held until the user closes or dies
                    pass
            else:
                await _send(writer, {"ok": False, "error": f"unknown op {op!r}"})
        except (OSError, ValueError, KeyError, TypeError) as e:
            logger.warning("bad client on the lease socket: %r", e)
        finally:
            if user is not None:
                self.leases.pop(writer, None)
                self.front.remove(user)
                if not self.leases:
                    self.idle_since = time.monotonic()
                logger.info("user pid %d left (%d users)", user.pid, len(self.leases))
            if not writer.is_closing():
                writer.close()

    async def _shutdown(self) -> None:
        self._stop_listening()
        reason = self._stop_reason or "host exiting"
        logger.info("stopping shared stack: %s", reason)
        for writer in list(self.leases):
            with contextlib.suppress(OSError, ConnectionError):
                await _send(writer, {"event": "down", "reason": reason})
            writer.close()
        try:
            if self.stack is not None:
                await self.stack.stop()
        finally:
            await self.front.stop()
        logger.info("shared stack stopped")


def _loopback_url(url: str) -> str:
    """Users' proxies must be on loopback: the front never forwards off the machine. Parsed,
    not prefix-matched: `http://127.0.0.1:1@elsewhere:80` starts like a loopback URL."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if (
        parts.scheme != "http"
        or parts.hostname != LOOPBACK
        or "@" in parts.netloc
        or port is None
        or parts.path.strip("/")
        or parts.query
        or parts.fragment
    ):
        raise ValueError(f"user proxy {url!r} is not http://{LOOPBACK}:<port>")
    return f"http://{LOOPBACK}:{port}"


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
) -> dict[str, Any]:
    """`stack up`: a persistent stack for `config_paths` (started, or an automatic one made
    persistent) that stays until `stack down` or `idle_timeout` seconds without users
    (None: no limit). Returns its status."""
    deadline = time.monotonic() + start_timeout + 60
    directory = stack_dir(stack_key(venv, config_paths))
    async with stack_lock(directory, deadline, "stack up"):
        if not _socket_path(directory).exists() or not await _answers(directory):
            spec = HostSpec.of(venv, config_paths, idle_timeout, start_timeout, persistent=True)
            proc = spawn_host(directory, spec)
            while True:
                if (code := proc.poll()) is not None:
                    raise StackError(
                        f"the NeMo Gym stack host exited with status {code} before it was "
                        f"ready; log tail ({directory / 'host.log'}):\n{_log_tail(directory)}"
                    )
                if _socket_path(directory).exists() and await _answers(directory):
                    break
                if time.monotonic() > deadline:
                    proc.send_signal(signal.SIGTERM)
                    raise StackError(f"the NeMo Gym stack was not ready in time ({directory})")
                await asyncio.sleep(0.2)
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
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            raise StackError(f"the NeMo Gym stack host (pid {pid}) did not stop in {timeout:g} s")
        await asyncio.sleep(0.2)
    return pid


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().split(b") ", 1)[1][:1] != b"Z"
    except (OSError, IndexError):
        return False
