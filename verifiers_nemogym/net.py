"""Loopback ports and servers: the one way the package binds its own HTTP servers.

Our aiohttp servers bind through `serve_app` (port 0 bound by itself, so no other process takes
it between choosing and binding), sharing the `AppServer` lifecycle; `free_port()` is only for a
port another program must be told before it binds (NeMo Gym's head server). `forward` passes a
call on to an upstream, with a `forwarding_session`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

import aiohttp
from aiohttp import web

if TYPE_CHECKING:
    from verifiers_nemogym.bridge.wire import ConnectionGate

LOOPBACK = "127.0.0.1"
LINGERING_TIME = 2.0
"""Seconds a server goes on reading (and dropping) a body it answered before reading it whole."""


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address without brackets) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Ports above NeMo Gym's server range (10001-20000 by default) and Ray's worker ports
# (10002-19999), below the kernel's ephemeral range (`_EPHEMERAL_RANGE`).
_HANDOFF_LOW = 20_001
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_HANDOFF_TRIES = 50


def bind_error(host: str, port: int = 0) -> OSError | None:
    """Why `host:port` cannot be bound now (not an address of this machine, or the port is
    taken), None if it can; the probe socket is closed again at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            return e
    return None


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out for outgoing connections and port-0 binds."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on `host` right now, for a program told it before it binds it. Drawn at
    random from `_HANDOFF_LOW` up to the kernel's ephemeral range: the kernel's own choice for
    port 0 lies in that range, where every outgoing connection's source port and every port-0
    bind (dozens a second while Ray starts) may take it first. The kernel's choice if no port
    there is free (or the range is empty)."""
    high = _ephemeral_low() - 1
    for _ in range(_HANDOFF_TRIES if high >= _HANDOFF_LOW else 0):
        port = random.randint(_HANDOFF_LOW, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


async def serve_app(
    app: web.Application,
    host: str = LOOPBACK,
    port: int = 0,
    *,
    shutdown_timeout: float = 60.0,
    ssl_context: ssl.SSLContext | None = None,
    gate: ConnectionGate | None = None,
) -> tuple[web.AppRunner, int]:
    """Serve `app` on `host:port` (0 = a free port) until the returned runner's `cleanup()`.

    Returns the runner and the bound port. No access log (one line per request costs CPU and
    drowns progress) and no signal handlers (the owner decides what Ctrl-C does). The backlog
    is deep enough for hundreds of rollouts connecting at once. `shutdown_timeout` bounds how
    long `cleanup()` waits for handlers still running (e.g. a deliberately hung answer).
    `ssl_context`: serve TLS with it (only the shared stack's `--listen` listener does).
    `gate`: accept connections through it (`wire.ConnectionGate`: what callers without a
    credential make aiohttp buffer is bounded), with its request-handler options.
    Raises OSError if the port cannot be bound (nothing is left running then).
    """
    handler_args: Mapping[str, Any] = {}
    if gate is not None:
        app.on_response_prepare.append(gate.on_response_prepare)
        handler_args = gate.handler_args
    runner = _Runner(
        app,
        gate,
        **handler_args,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=shutdown_timeout,
        # A body answered before it was read whole (a refusal) is read on and dropped this
        # long, so its sender gets the answer rather than a reset; aiohttp's 10 s would let
        # each refused caller keep a connection busy for that long.
        lingering_time=LINGERING_TIME,
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, backlog=4096, ssl_context=ssl_context).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, int(runner.addresses[0][1])


class _Runner(web.AppRunner):
    """An `AppRunner` whose sites accept connections through `gate`, if any: a site makes its
    listening socket's protocols with the runner's `server` (aiohttp's `TCPSite.start`)."""

    def __init__(self, app: web.Application, gate: ConnectionGate | None, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._gate = gate

    @property
    def server(self) -> Callable[[], asyncio.BaseProtocol] | None:  # type: ignore[override]
        server = super().server
        if server is None or self._gate is None:
            return server
        return self._gate.protocol_factory(server)


class AppServer:
    """Base of the package's own aiohttp servers: owns the runner and the bound port.

    A subclass has `host` and `port` attributes (0 = a free port; after `start()`, the bound
    port) and builds its routes in `_app()`. `start()` serves them through `serve_app`;
    `stop()` stops serving and is idempotent; `async with` does both, and stops (freeing
    anything a half-done `start()` opened) if `start()` raises. A subclass holding more
    resources opens them around `super().start()` and closes them around `super().stop()`; one
    that calls an upstream gives `_client_timeout()`, and `_session` is its client session from
    `start()` until `stop()` has stopped serving.
    `shutdown_timeout` bounds how long `stop()` waits for handlers still running; `ssl_context`,
    if set before `start()`, serves TLS (`url` is then `https://`).
    """

    host: str
    port: int
    shutdown_timeout: ClassVar[float] = 60.0
    ssl_context: ssl.SSLContext | None = None
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        """`http://host:port` (`https://` with TLS), the server's root."""
        scheme = "https" if self.ssl_context is not None else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """`url` + `/v1`, what an OpenAI-style client is given."""
        return f"{self.url}/v1"

    def _app(self) -> web.Application:
        """The application to serve (built anew by each `start()`)."""
        raise NotImplementedError

    def _client_timeout(self) -> aiohttp.ClientTimeout | None:
        """The timeout of the server's upstream client session; None: it opens none."""
        return None

    async def start(self) -> None:
        """Bind and serve; `port` is the bound port afterwards. OSError if it cannot bind."""
        if (timeout := self._client_timeout()) is not None:
            self._session = aiohttp.ClientSession(timeout=timeout)
        self._runner, self.port = await serve_app(
            self._app(),
            self.host,
            self.port,
            shutdown_timeout=self.shutdown_timeout,
            ssl_context=self.ssl_context,
            gate=self._gate(),
        )

    def _gate(self) -> ConnectionGate | None:
        """The gate to accept connections through (`serve_app`); None: none (servers whose
        callers are trusted, e.g. model doubles)."""
        return None

    async def stop(self) -> None:
        """Stop serving (waits up to `shutdown_timeout` for running handlers). Idempotent."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def forwarding_session(
    timeout: aiohttp.ClientTimeout | None = None,
    headers: Mapping[str, str] | None = None,
    **connector: Any,
) -> aiohttp.ClientSession:
    """An HTTP client for passing calls on: no cookie jar (each call is a session of its own
    upstream; NeMo Gym keys agent sessions by cookie), no limit on connections unless
    `connector` (`aiohttp.TCPConnector`'s arguments) sets one, no time limit unless `timeout`.
    Make it on the running event loop."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(**{"limit": 0, **connector}),
        cookie_jar=aiohttp.DummyCookieJar(),
        timeout=timeout or aiohttp.ClientTimeout(total=None),
        headers=headers,
    )


@dataclass(frozen=True)
class Forwarded:
    """An upstream's whole answer to a call `forward` passed on."""

    status: int
    content_type: str
    body: bytes
    headers: Mapping[str, str]

    def response(self) -> web.Response:
        """The answer, passed on as it came (JSON if it named no content type)."""
        return web.Response(
            body=self.body, status=self.status, content_type=self.content_type or "application/json"
        )


async def forward(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: Mapping[str, str] | None
) -> Forwarded:
    """POST `body` to `url` with `headers` and read the whole answer. The session's errors
    (aiohttp.ClientError, TimeoutError) reach the caller, which knows what they mean for it."""
    async with session.post(url, data=body, headers=headers) as upstream:
        payload = await upstream.read()
        return Forwarded(upstream.status, upstream.content_type, payload, upstream.headers)
