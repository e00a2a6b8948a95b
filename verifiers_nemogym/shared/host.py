"""The shared-stack host program: owns one shared NeMo Gym stack for every env process of it.

Started detached by `shared/client.py` (`spawn_host`), never by hand. `StackHost` runs the stack,
the front forwarder, the lease socket and, if asked, the TLS gate, until the stack is idle past
its timeout, told down, dead, or the process gets SIGTERM/SIGINT; the stack is stopped in every
case. Logs go to stderr (host.log). Exit status: 0 after a normal stop, 1 if the stack failed,
2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from verifiers_nemogym.bridge import redact as redact_module
from verifiers_nemogym.bridge.front import FrontForwarder, FrontUser, secret_digest
from verifiers_nemogym.bridge.redact import NOTICE_LIMIT, cut
from verifiers_nemogym.containers.seam import StackSandboxes
from verifiers_nemogym.errors import NeMoGymError, StackError
from verifiers_nemogym.judge.blame import JudgeFailure
from verifiers_nemogym.nemo.stack import CHECK_ALIVE_INTERVAL, NeMoGymStack, start_stack
from verifiers_nemogym.nemo.venv import NeMoGymVenv, ensure_venv
from verifiers_nemogym.net import LOOPBACK
from verifiers_nemogym.shared import protocol
from verifiers_nemogym.shared.gate import StackGate
from verifiers_nemogym.shared.protocol import HostSpec, receive, send
from verifiers_nemogym.shared.tls import parse_listen
from verifiers_nemogym.util import Latch, acquire_flock, try_flock

logger = logging.getLogger(__name__)

FIRST_MESSAGE_TIMEOUT = 10.0
"""Seconds a connection to the lease socket may stay silent before the host drops it."""
HOST_LOCK_WAIT = 5.0
"""Seconds a host not handed `host.lock` by its spawner retries it before giving up."""


async def claim_host_lock(directory: Path) -> IO[str]:
    """`directory/host.lock`, exclusively flocked for the caller's whole life (closing it, or
    dying, releases it): the one host of the stack. StackError if another host holds it."""
    try:
        path = directory / protocol.HOST_LOCK
        return await acquire_flock(path, time.monotonic() + HOST_LOCK_WAIT)
    except TimeoutError:
        raise StackError(f"another stack host runs for {directory}; this one exits") from None


def _socket_accepts(path: Path) -> bool:
    """Whether something accepts connections on the unix socket `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2)
        try:
            probe.connect(str(path))
        except OSError:
            return False
        return True


class StackHost:
    """The stack host process's work: front + stack + lease socket, until idle or told down.

    `run()` returns once everything it started is stopped. Leases are connections to the socket
    (the messages are `shared/protocol.py`'s).
    """

    def __init__(
        self,
        venv: NeMoGymVenv,
        directory: Path,
        spec: HostSpec,
        host_lock: IO[str] | None = None,
        secrets: dict[str, Any] | None = None,
    ) -> None:
        """`host_lock`: `host.lock` already flocked for this host (handed over by its spawner);
        None: `run()` claims it. `secrets`: what came on stdin (`protocol.host_secrets`)."""
        self.venv = venv
        self._host_lock = host_lock
        self.secrets = secrets or {}
        self.directory = directory
        self.spec = spec
        self.front = FrontForwarder()
        self.stack: NeMoGymStack | None = None
        self.leases: dict[asyncio.StreamWriter, FrontUser] = {}
        self.idle_since = time.monotonic()
        self.started_at = time.time()
        self.leases_total = 0
        self.stopping = Latch()
        """Set, with the reason, once the host is to stop (idle, told down, stack dead, signal)."""
        self._server: asyncio.AbstractServer | None = None
        self._bound_inode: int | None = None
        self.gate: StackGate | None = None
        """The TLS listener for remote users, once `OP_PERSIST` asked for one (`listen`)."""
        self._background: set[asyncio.Task[None]] = set()
        self.claimed = False
        """Whether a user leased this host or `stack up` claimed it; an unclaimed ready host
        stops after `protocol.UNCLAIMED_GRACE` s (its starter was cancelled or killed)."""

    async def run(self) -> None:
        """Raises StackError (having started nothing) if another host holds `host.lock`."""
        host_lock = self._host_lock or await claim_host_lock(self.directory)
        try:
            await self._run()
        finally:
            host_lock.close()  # last: the stack is stopped and the socket gone

    async def _run(self) -> None:
        try:
            await self.front.start()
            self.stack = await start_stack(
                lambda seconds: NeMoGymStack(
                    self.venv,
                    [Path(p) for p in self.spec.config_paths],
                    policy_host=self.front.host,
                    policy_port=self.front.port,
                    start_timeout=seconds,
                    judge=self.spec.judge_with(self.secrets),
                    on_judge_failure=self._tell_judge_failure,
                    ray=self.spec.ray_with(self.secrets),
                    allow_unisolated_containers=self.spec.allow_unisolated_containers,
                    sandbox_packages=self.spec.sandbox_packages,
                    sandboxes=StackSandboxes,
                ),
                self.spec.start_timeout,
                logger,
            )
            # Listening last: a user that can connect finds a ready stack.
            self._server = await asyncio.start_unix_server(
                self._serve, sock=self._bind(), limit=protocol.LINE_LIMIT
            )
            self.idle_since = time.monotonic()
            logger.info("shared stack ready; agents: %s", ", ".join(sorted(self.stack.agents)))
            await self._supervise()
        finally:
            await self._shutdown()

    def _bind(self) -> socket.socket:
        """The listening socket at `host.sock`. A leftover file is a dead host's (we hold
        `host.lock`), removed, unless something answers on it: then StackError, never a bind
        over a live socket (asyncio's own bind would silently remove it)."""
        path = self.directory / protocol.SOCKET
        if path.exists() or path.is_symlink():
            if _socket_accepts(path):
                raise StackError(f"something else answers on {path}; not replacing it")
            path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(path))
            os.chmod(path, 0o600)
            self._bound_inode = path.stat().st_ino
            sock.listen(100)
        except BaseException:
            sock.close()
            raise
        return sock

    async def _supervise(self) -> None:
        last_check = time.monotonic()
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), 0.5)
            now = time.monotonic()
            if self.stack is not None and now - last_check >= CHECK_ALIVE_INTERVAL:
                last_check = now
                try:
                    await self.stack.check_alive()
                except StackError as e:
                    self.stopping.set(f"the stack died: {e}")
            timeout = self.spec.idle_timeout
            if not self.claimed:
                grace = protocol.UNCLAIMED_GRACE
                timeout = grace if timeout is None else min(timeout, grace)
            idle = not self._users() and timeout is not None and now - self.idle_since >= timeout
            if idle and await self._close_if_still_idle():
                self.stopping.set(f"no user for {timeout:g} s")

    async def _close_if_still_idle(self) -> bool:
        """Under the flock, so no user can be attaching meanwhile: stop listening if idle."""
        try:
            handle = try_flock(self.directory / protocol.LOCK)
        except OSError:
            return True
        if handle is None:
            return False  # someone is attaching; look again later
        try:
            if self._users():
                return False
            self._stop_listening()
            return True
        finally:
            handle.close()

    def _stop_listening(self) -> None:
        """Stop accepting; remove `host.sock` only if it is still the socket this host bound
        (never another host's)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._bound_inode is None:
            return
        path = self.directory / protocol.SOCKET
        with contextlib.suppress(FileNotFoundError):
            if path.lstat().st_ino == self._bound_inode:
                path.unlink()
        self._bound_inode = None

    def _users(self) -> int:
        """Users holding a lease: local ones and remote ones (over the gate)."""
        return len(self.leases) + (len(self.gate.users) if self.gate is not None else 0)

    def _users_changed(self) -> None:
        if not self._users():
            self.idle_since = time.monotonic()

    def _tell_judge_failure(self, failure: JudgeFailure) -> None:
        """Any user's rollout may have been graded by the failed call: tell them all (with its
        prompt, which each user matches against its rollouts' questions)."""
        event = protocol.judge_failed_event(failure)
        for writer in list(self.leases):
            with contextlib.suppress(OSError, ConnectionError, RuntimeError):
                protocol.post(writer, event)
        if self.gate is not None:
            task = asyncio.create_task(self.gate.broadcast(event))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def describe_for_remote(self) -> dict[str, Any]:
        """What a remote user learns of the stack (`GET /stack`, the lease's answer): no
        loopback URL, path or marker of this machine."""
        assert self.stack is not None
        relay = self.stack.relay
        return {
            "pid": os.getpid(),
            "agents": sorted(self.stack.run_urls),
            "nemo_gym_version": self.venv.nemo_gym_version,
            "python_version": self.venv.python_version,
            "judge": relay.judge.public() if relay is not None else None,
        }

    async def listen(self, address: str) -> None:
        """Start the TLS listener on `address` (`HOST:PORT`) unless it runs there already;
        StackError if it runs elsewhere or cannot bind (ConfigError if `address` is malformed)."""
        host, port = parse_listen(address)
        if self.gate is not None:
            if (self.gate.host, self.gate.port) != (host, port):
                raise StackError(
                    f"this stack already listens on {self.gate.url}; `stack down` it first"
                )
            return
        assert self.stack is not None
        gate = StackGate(
            host, port, directory=self.directory, front=self.front,
            run_urls=self.stack.run_urls, describe=self.describe_for_remote,
            on_users=self._users_changed,
        )  # fmt: skip
        try:
            await gate.start()
        except OSError as e:
            await gate.stop()
            raise StackError(f"cannot listen on {address} ({e.strerror})") from None
        self.gate = gate

    def status(self) -> dict[str, Any]:
        assert self.stack is not None
        relay = self.stack.relay
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
            "remote_users": len(self.gate.users) if self.gate is not None else 0,
            "listen": self.gate.public() if self.gate is not None else None,
            "user_pids": sorted(u.pid for u in self.leases.values()),
            "leases_total": self.leases_total,
            "model_calls": self.front.calls,
            "idle_timeout": self.spec.idle_timeout,
            "persistent": self.spec.persistent,
            "uptime_s": round(time.time() - self.started_at, 1),
            "log": str(self.directory / protocol.LOG),
            "judge": relay.judge.public() if relay is not None else None,
            "judge_stats": relay.stats.summary() if relay is not None else None,
            "ray_address": self.spec.ray["address"] if self.spec.ray is not None else None,
        }

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        user: FrontUser | None = None
        try:
            uid = protocol.peer_uid(writer)
            if uid != os.getuid():
                logger.warning("refused a connection from uid %d on the lease socket", uid)
                return
            async with asyncio.timeout(FIRST_MESSAGE_TIMEOUT):
                message = await receive(reader)
            if message is None:
                return
            op = message.get("op")
            if self.stopping.is_set():
                await send(writer, protocol.refusal("shutting down"))
            elif op == protocol.OP_STATUS:
                await send(writer, self.status())
            elif op == protocol.OP_PERSIST:
                # `stack up` on a running stack: keep it until down or the new idle timeout.
                try:
                    timeout = protocol.check_idle_timeout(message.get("idle_timeout"))
                    if message.get("listen"):
                        await self.listen(str(message["listen"]))
                except NeMoGymError as e:
                    await send(writer, protocol.refusal(str(e)))
                    return
                self.spec = dataclasses.replace(self.spec, persistent=True, idle_timeout=timeout)
                self.claimed = True
                self.idle_since = time.monotonic()
                await send(writer, self.status())
            elif op == protocol.OP_DOWN:
                self.stopping.set("stack down requested")
                await send(writer, {"ok": True, "pid": os.getpid()})
            elif op == protocol.OP_LEASE:
                user = FrontUser(
                    pid=int(message["pid"]),
                    proxy_url=_loopback_url(str(message["proxy_url"])),
                    secret_digest=secret_digest(str(message["secret"])),
                )
                self.front.add(user)
                self.leases[writer] = user
                self.claimed = True
                self.leases_total += 1
                answer = self.status()
                await send(writer, answer)
                logger.info("user pid %d attached (%d users)", user.pid, len(self.leases))
                while await reader.read(4096):  # held until the user closes or dies
                    pass
            else:
                await send(writer, protocol.refusal(f"unknown op {op!r}"))
        except (OSError, ValueError, KeyError, TypeError, TimeoutError) as e:
            logger.warning("bad client on the lease socket: %r", e)
        finally:
            if user is not None:
                self.leases.pop(writer, None)
                self.front.remove(user)
                self._users_changed()
                logger.info("user pid %d left (%d users)", user.pid, len(self.leases))
            if not writer.is_closing():
                writer.close()

    async def _shutdown(self) -> None:
        self._stop_listening()
        # Pattern redaction: the host knows no secret's value (only digests), but a death notice
        # quoting a server's log can carry any user's row, secret included.
        reason = cut(self.stopping.reason or "host exiting", NOTICE_LIMIT)
        logger.info("stopping shared stack: %s", reason)
        for writer in list(self.leases):
            with contextlib.suppress(OSError, ConnectionError):
                await send(writer, protocol.down_event(reason))
            writer.close()
        if self.gate is not None:
            await self.gate.broadcast(protocol.down_event(reason))
            await self.gate.stop()
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


async def _run(
    directory: Path, spec: HostSpec, host_lock: IO[str] | None, secrets: dict[str, Any]
) -> None:
    venv = await asyncio.to_thread(
        ensure_venv, spec.nemo_gym_version, spec.python, allow_below_floor=spec.below_floor
    )
    host = StackHost(venv, directory, spec, host_lock, secrets)
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def on_signal() -> None:
        # Before the stack is up, cancel the start (NeMoGymStack.start cleans up on cancel);
        # afterwards, a normal stop.
        if host.stack is not None and host.stack.agents:
            host.stopping.set("signal")
        else:
            task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, on_signal)
    await host.run()


def main(argv: list[str] | None = None) -> int:
    """The host program (see the module doc); returns its exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--lock-fd", type=int, help="host.lock, flocked, from the spawner")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        spec = HostSpec.from_json(args.spec)
        # Secrets come on stdin (one JSON line), never in arguments or the environment.
        secrets = json.loads(sys.stdin.readline() or "{}")
        if not isinstance(secrets, dict):
            raise ValueError("stdin must hold a JSON object")
        judge = spec.judge_with(secrets)
    except (ValueError, TypeError) as e:
        logger.error("stack_host: bad --spec or stdin: %s", e)
        return 2
    for secret in judge.secret_values() if judge is not None else []:
        redact_module.protect(secret)
    if (ray := spec.ray_with(secrets)) is not None and ray.token:
        redact_module.protect(ray.token)
    try:
        # Taken over at once: the spawner's flock on host.lock stays held by this open file.
        host_lock = None
        if args.lock_fd is not None:
            # Not inherited further: a child holding it would keep "a host runs" true after us.
            os.set_inheritable(args.lock_fd, False)
            host_lock = os.fdopen(args.lock_fd, "a")
        asyncio.run(_run(args.dir, spec, host_lock, secrets))
    except asyncio.CancelledError:
        return 1
    except NeMoGymError as e:
        logger.error("stack_host: %s", cut(str(e), NOTICE_LIMIT))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
