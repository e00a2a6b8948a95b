"""An env process's lease on a shared stack host on another host (`stack_url` with
`--env.taskset.stack-pin`), through the host's TLS listener (`shared/gate.py` is that listener and
its wire): `describe_gate` checks the listener (pinned certificate, access token) and describes
its stack as a `GateTarget`; `GateLink` holds the lease and answers the model calls that ride
back on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from verifiers_nemogym.bridge import redact
from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.judge.blame import JudgeStatus
from verifiers_nemogym.net import LOOPBACK, forward, forwarding_session
from verifiers_nemogym.shared import gate, protocol, tls
from verifiers_nemogym.util import Latch, cancel_and_wait

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GateTarget:
    """A shared stack host's TLS listener (`stack_url` with `stack_pin`, `shared/gate.py`), as
    `describe_gate` found it: the token it accepted, the stack's description."""

    url: str
    pin: str
    token: str = field(repr=False)
    description: dict[str, Any]

    @property
    def run_urls(self) -> dict[str, str]:
        """Agent instance name -> where its rollouts' `POST /run` goes: through the gate."""
        return {name: f"{self.url}{gate.AGENTS_PREFIX}/{name}" for name in self.agents}

    @property
    def agents(self) -> list[str]:
        return [str(a) for a in self.description.get("agents") or []]

    @property
    def policy_address(self) -> tuple[str, int]:
        """Where this env's model proxy listens: loopback, any free port (its model calls ride
        back on the lease, `GateLink`)."""
        return LOOPBACK, 0

    def client_session(self, timeout: aiohttp.ClientTimeout | None = None) -> aiohttp.ClientSession:
        """An HTTP client for the gate: TLS pinned to its certificate, the token on every
        request, connections that fail within `tls.LINK_TIMEOUT` s of the link going silent."""
        return forwarding_session(
            timeout,
            gate.bearer(self.token),
            ssl=tls.client_ssl(self.pin),
            socket_factory=tls.keepalive_socket,
        )


def _gate_url(url: str) -> str:
    parts = urlsplit(url.rstrip("/"))
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            "--env.taskset.stack-url carries credentials (user:password@); give the access "
            f"token by --env.taskset.stack-token-file or {tls.TOKEN_ENV_VAR}"
        )
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "https" or not parts.hostname or port is None or parts.path:
        raise ConfigError(
            f"--env.taskset.stack-url {url[:200]!r} with --env.taskset.stack-pin must be "
            "https://HOST:PORT, as `nemo-gym-env stack up --listen` prints it"
        )
    return f"https://{parts.netloc}"


async def describe_gate(url: str, pin: str, token_file: Path | None) -> GateTarget:
    """The stack behind the gate at `url` (see `GateTarget`). One-line errors, nothing started:
    ConfigError for a malformed URL or pin, no token, a certificate other than the pinned one
    (named by both pins) or a refused token; StackError if the gate cannot be reached."""
    url = _gate_url(url)
    tls.parse_pin(pin)
    token = tls.read_token(token_file)
    redact.protect(token)
    target = GateTarget(url, pin, token, {})
    timeout = aiohttp.ClientTimeout(total=30)
    try:
        async with (
            target.client_session(timeout=timeout) as http,
            http.get(url + gate.STACK_PATH) as response,
        ):
            if response.status == 401:
                raise ConfigError(
                    f"the stack host at {url} refused the access token (the token of another "
                    "stack, or of an earlier start of it? `stack up --listen` prints its file)"
                )
            if response.status != 200:
                raise StackError(f"the stack host at {url} answered {response.status}")
            description = await response.json()
    except (ConfigError, StackError):
        raise
    except aiohttp.ServerFingerprintMismatch as e:
        raise ConfigError(
            f"the stack host at {url} presented the certificate sha256:{e.got.hex()}, not "
            f"the pinned {pin}: not that stack host (or it started anew: use the pin it printed)"
        ) from None
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        raise StackError(f"the stack host at {url} is unreachable ({type(e).__name__})") from None
    if not isinstance(description, dict) or not description.get("agents"):
        raise StackError(f"the stack host at {url} describes no agent")
    return GateTarget(url, pin, token, description)


CONNECT_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10)
"""A connection to a gate is made in 10 s or fails (a request then waits as long as it takes:
a lost link fails it through `tls.keepalive_socket`)."""


class GateLink:
    """An env process's lease on a stack host's gate (`shared/gate.py`), kept across lost links.

    `open()` leases once (errors raise, as any failed start); then the lease is held, and each
    model call the host sends on it is posted to this process's proxy (`proxy_url`, loopback)
    and answered on it. A link that drops is connected again (every `RECONNECT_MAX` s at most);
    rollouts in flight meanwhile fail by themselves (their `/run` connections are
    `tls.keepalive_socket`s). `lost` is set, with its reason, only when the stack is gone: the
    host said it goes down, or refused `REFUSED_MISSES` connections in a row (nothing listens)."""

    RECONNECT_MAX = 5.0
    REFUSED_MISSES = 3

    def __init__(self, target: GateTarget, proxy_url: str, proxy_secret: str) -> None:
        self.target = target
        self.proxy_url = proxy_url
        self._hello = {"op": "lease", "pid": os.getpid(), "secret": proxy_secret}
        self.lost = Latch()
        self.connected = asyncio.Event()
        self.links = 0
        """Leases made so far (1 + reconnections)."""
        judge = target.description.get("judge")
        self.judge = JudgeStatus(dict(judge)) if isinstance(judge, dict) else None
        self._http: aiohttp.ClientSession | None = None
        self._local: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        self._http = self.target.client_session(timeout=CONNECT_TIMEOUT)
        self._local = forwarding_session()
        try:
            first = await self._connect()
        except BaseException:
            await self.close()
            raise
        self._task = asyncio.create_task(self._keep(first))

    async def _connect(self) -> aiohttp.ClientWebSocketResponse:
        assert self._http is not None
        ws = await self._http.ws_connect(
            self.target.url + gate.LEASE_PATH,
            heartbeat=gate.HEARTBEAT,
            max_msg_size=gate.MAX_FRAME_BYTES,
            timeout=aiohttp.ClientWSTimeout(ws_close=5),
        )
        try:
            await ws.send_json(self._hello)
            async with asyncio.timeout(gate.HELLO_TIMEOUT):
                answer = await ws.receive_json()
            if not isinstance(answer, dict) or not answer.get("ok"):
                raise StackError(f"the stack host at {self.target.url} refused the lease")
        except BaseException:
            await ws.close()
            raise
        self.links += 1
        self.connected.set()
        return ws

    async def _keep(self, first: aiohttp.ClientWebSocketResponse) -> None:
        ws: aiohttp.ClientWebSocketResponse | None = first
        refused = 0
        delay = 1.0
        while True:
            if ws is not None:
                down = await self._serve(ws)
                self.connected.clear()
                if down is not None:
                    self.lost.set(f"the shared NeMo Gym stack went down: {down}")
                    return
                logger.warning("lost the link to the stack host %s; reconnecting", self.target.url)
            await asyncio.sleep(delay)
            try:
                ws = await self._connect()
                refused, delay = 0, 1.0
                logger.info("link to the stack host at %s is back", self.target.url)
            except aiohttp.WSServerHandshakeError as e:
                if e.status == 401:
                    self.lost.set(f"the stack host at {self.target.url} no longer takes the token")
                    return
                ws = None
            except aiohttp.ServerFingerprintMismatch:
                self.lost.set(f"the stack host at {self.target.url} presents another certificate")
                return
            except aiohttp.ClientConnectorError as e:
                ws = None
                refused = refused + 1 if isinstance(e.os_error, ConnectionRefusedError) else 0
                if refused >= self.REFUSED_MISSES:
                    self.lost.set(f"the stack host at {self.target.url} stopped listening")
                    return
            except (aiohttp.ClientError, StackError, TimeoutError, ValueError, OSError):
                ws = None
            delay = min(delay * 2, self.RECONNECT_MAX)

    async def _serve(self, ws: aiohttp.ClientWebSocketResponse) -> str | None:
        """Answer the host's calls until the lease closes; the host's reason if it went down."""
        down: str | None = None
        try:
            async for message in ws:
                if message.type == aiohttp.WSMsgType.BINARY:
                    task = asyncio.create_task(self._answer(ws, *gate.unframe(message.data)))
                    self._calls.add(task)
                    task.add_done_callback(self._calls.discard)
                elif message.type == aiohttp.WSMsgType.TEXT:
                    down = protocol.take_event(json.loads(message.data), self.judge)
                    if down is not None:
                        break  # its last word: the host closes next
        except (ValueError, KeyError, TypeError, AttributeError, aiohttp.ClientError) as e:
            # A malformed message ends this lease, never the link's upkeep: it connects again.
            logger.warning("bad message from the stack host: %s", type(e).__name__)
        finally:
            await ws.close()
        return down

    async def _answer(
        self, ws: aiohttp.ClientWebSocketResponse, header: dict[str, Any], body: bytes
    ) -> None:
        """Post one carried model call to this process's proxy; its answer goes back."""
        assert self._local is not None
        try:
            got = await forward(
                self._local, self.proxy_url + str(header["path"]), body, header.get("headers")
            )
            payload, answer = got.body, {"status": got.status, "content_type": got.content_type}
        except aiohttp.ClientError as e:
            payload = json.dumps({"error": {"message": repr(e), "type": "gone"}}).encode()
            answer = {"status": 410, "content_type": "application/json"}
        with contextlib.suppress(ConnectionError, RuntimeError, aiohttp.ClientError):
            await ws.send_bytes(gate.frame({"id": header["id"], **answer}, payload))

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)  # first: it starts calls while it runs
        await cancel_and_wait(*self._calls)
        for session in (self._http, self._local):
            if session is not None:
                await session.close()
        self._http = self._local = None
        redact.forget(self.target.token)
