"""The gate: a shared stack host's TLS listener for env processes on other hosts.

`stack up ENV --listen HOST:PORT` makes the stack host serve, on HOST:PORT only, HTTPS with a
pinned self-signed certificate (`shared/tls.py`) and an access token checked before any body is
read; `GateLink` (`shared/gate_client.py`) is the client. It forwards `/run` to the agents and
carries a remote user's lease, and that user's model calls, over one WebSocket. The wire and why
it is a channel the env process opens: docs/shared-stacks.md, "Across hosts".
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
from aiohttp import web

from verifiers_nemogym.bridge import wire
from verifiers_nemogym.bridge.front import FRONT_CALL_TIMEOUT, FrontForwarder, FrontUser
from verifiers_nemogym.net import LOOPBACK, AppServer, forward, forwarding_session
from verifiers_nemogym.shared import tls

logger = logging.getLogger(__name__)

HEARTBEAT = 30.0
"""Seconds between WebSocket pings on a lease; one unanswered for half that ends it. Long on
purpose: a lost link is found by both ends' kernels within `tls.LINK_TIMEOUT` (keepalive), and a
ping only catches a peer whose kernel answers while the process does not; a short one (5 s)
ended leases of env processes that a loaded machine did not run for 2.5 s."""
HELLO_TIMEOUT = 10.0
"""Seconds a new lease may take to say hello."""
MAX_FRAME_BYTES = wire.MAX_BODY_BYTES + (1 << 20)
"""Largest frame on a lease: a model call's body (`wire.MAX_BODY_BYTES`) and its header."""
LEASE_PATH = "/lease"
STACK_PATH = "/stack"
AGENTS_PREFIX = "/agents"


def frame(header: dict[str, Any], body: bytes) -> bytes:
    """One binary lease message: header length (4 bytes, big-endian), JSON header, body."""
    encoded = json.dumps(header).encode()
    return struct.pack(">I", len(encoded)) + encoded + body


def unframe(data: bytes) -> tuple[dict[str, Any], bytes]:
    """`frame`'s inverse; ValueError if `data` is not a frame."""
    if len(data) < 4:
        raise ValueError("short frame")
    (size,) = struct.unpack(">I", data[:4])
    header = json.loads(data[4 : 4 + size])
    if not isinstance(header, dict):
        raise ValueError("a frame header must be a JSON object")
    return header, data[4 + size :]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass(eq=False)
class RemoteUser:
    """An env process on another host, leased over `ws`; `key` names it on the relay."""

    key: str
    pid: int
    ws: web.WebSocketResponse
    front_user: FrontUser
    pending: dict[int, asyncio.Future[tuple[int, str, bytes]]] = field(default_factory=dict)
    ids: itertools.count[int] = field(default_factory=itertools.count)

    async def call(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, str, bytes]:
        """One model call carried to the env process; its (status, content type, body).
        ConnectionError if the lease is gone (or goes before the answer)."""
        if self.ws.closed:
            raise ConnectionError("the lease is closed")
        call_id = next(self.ids)
        answer: asyncio.Future[tuple[int, str, bytes]] = asyncio.get_running_loop().create_future()
        self.pending[call_id] = answer
        try:
            await self.ws.send_bytes(frame({"id": call_id, "path": path, "headers": headers}, body))
            return await answer
        finally:
            self.pending.pop(call_id, None)

    def answered(self, header: dict[str, Any], body: bytes) -> None:
        answer = self.pending.get(int(header["id"]))
        if answer is not None and not answer.done():
            answer.set_result((int(header["status"]), str(header["content_type"]), body))

    def lost(self) -> None:
        for answer in self.pending.values():
            if not answer.done():
                answer.set_exception(ConnectionError("the lease closed"))


class _Relay(AppServer):
    """Loopback only: where the front sends a remote user's calls (`<url>/u/<key>/<path>`)."""

    def __init__(self, users: dict[str, RemoteUser]) -> None:
        self.host = LOOPBACK
        self.port = 0
        self.users = users

    def _gate(self) -> wire.ConnectionGate:
        return wire.shared_gate()

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=wire.MAX_BODY_BYTES)
        app.router.add_post("/u/{key}/{tail:.*}", self._relay)
        return app

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        user = self.users.get(request.match_info["key"])
        if user is None:
            return wire.json_error(410, "the env process owning this call has left", "gone")
        wire.shared_gate().admitted(request)  # its key is its credential
        body = await request.read()
        path = "/" + request.match_info["tail"]
        if request.query_string:
            path += "?" + request.query_string
        headers = {k: v for k, v in request.headers.items() if k.lower() in wire.FORWARDED_HEADERS}
        try:
            async with asyncio.timeout(FRONT_CALL_TIMEOUT):
                status, content_type, payload = await user.call(path, headers, body)
        except (ConnectionError, TimeoutError) as e:
            return wire.json_error(
                410, f"the link to the env process (pid {user.pid}) owning this call is down: {e}",
                "gone",
            )  # fmt: skip
        return web.Response(body=payload, status=status, content_type=content_type)


class StackGate(AppServer):
    """The gate (module docstring). `describe()` gives the stack's description; `on_users()` is
    called whenever a remote user comes or goes."""

    shutdown_timeout: ClassVar[float] = 5.0
    """Seconds `stop()` waits for `/run`s still being forwarded (the stack stops next)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        directory: Path,
        front: FrontForwarder,
        run_urls: dict[str, str],
        describe: Callable[[], dict[str, Any]],
        on_users: Callable[[], None],
    ) -> None:
        self.host = host
        self.port = port
        self.directory = directory
        self.front = front
        self.run_urls = dict(run_urls)
        self.describe = describe
        self.on_users = on_users
        self.users: dict[str, RemoteUser] = {}
        self.pin = ""
        self.token_file = directory / tls.TOKEN_FILE
        self._token = b""
        self._relay = _Relay(self.users)
        self._http: aiohttp.ClientSession | None = None

    def _gate(self) -> wire.ConnectionGate:
        return wire.shared_gate()

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=wire.MAX_BODY_BYTES, middlewares=[self._authorize])
        app.router.add_get(STACK_PATH, self._stack)
        app.router.add_post(AGENTS_PREFIX + "/{agent}/{tail:.*}", self._forward)
        app.router.add_get(LEASE_PATH, self._lease)
        return app

    async def start(self) -> None:
        """Make the certificate and the token, then listen (OSError if it cannot bind)."""
        self.pin = tls.make_certificate(self.directory, self.host)
        self._token = tls.write_token(self.token_file).encode()
        self.ssl_context = tls.server_context(self.directory)
        await self._relay.start()
        self._http = forwarding_session(aiohttp.ClientTimeout(total=None, sock_connect=10))
        await super().start()
        logger.info("listening for env processes on other hosts at %s (pin %s)", self.url, self.pin)

    async def stop(self) -> None:
        for user in list(self.users.values()):
            await user.ws.close()
        await super().stop()
        await self._relay.stop()
        if self._http is not None:
            http, self._http = self._http, None
            await http.close()

    def public(self) -> dict[str, Any]:
        """What `stack status` and `stack up` show: where, the pin, the token's file."""
        return {"url": self.url, "pin": self.pin, "token_file": str(self.token_file)}

    async def broadcast(self, event: dict[str, Any]) -> None:
        """A lease event (`lease.down_event`, `lease.judge_failed_event`) to every remote user."""
        for user in list(self.users.values()):
            with contextlib.suppress(ConnectionError, RuntimeError):
                await user.ws.send_str(json.dumps(event))

    @web.middleware
    async def _authorize(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        # Before any handler, so before any body is read; the same answer whatever is wrong.
        given = request.headers.get("Authorization", "")
        token = given[7:].encode("utf-8", "surrogateescape") if given.startswith("Bearer ") else b""
        if not self._token or not hmac.compare_digest(token, self._token):
            return wire.json_error(401, "missing or wrong access token", "unauthorized")
        wire.shared_gate().admitted(request)
        return await handler(request)

    async def _stack(self, request: web.Request) -> web.Response:
        return web.json_response(self.describe())

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        target = self.run_urls.get(request.match_info["agent"])
        if target is None:
            return wire.json_error(404, "no such agent on this stack", "unknown_agent")
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        assert self._http is not None
        try:
            answer = await forward(
                self._http, f"{target}/{request.match_info['tail']}", body, headers
            )
        except aiohttp.ClientError as e:
            return wire.json_error(502, f"the stack's server failed: {e!r}", "upstream_error")
        return answer.response()

    async def _lease(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(heartbeat=HEARTBEAT, max_msg_size=MAX_FRAME_BYTES)
        if request.transport is not None and (sock := request.transport.get_extra_info("socket")):
            tls.set_keepalive(sock)  # this end, too, learns of a lost link from its kernel
        await ws.prepare(request)
        user: RemoteUser | None = None
        try:
            async with asyncio.timeout(HELLO_TIMEOUT):
                hello = await ws.receive_json()
            if not isinstance(hello, dict) or hello.get("op") != "lease":
                raise ValueError("the first message must be a lease hello")
            key = f"{id(ws):x}"
            front_user = FrontUser(
                pid=int(hello["pid"]),
                proxy_url=f"{self._relay.url}/u/{key}",
                secret_digest=wire.secret_digest(str(hello["secret"])),
            )
            user = RemoteUser(key, front_user.pid, ws, front_user)
            self.users[key] = user
            self.front.add(front_user)
            self.on_users()
            await ws.send_json({"ok": True, **self.describe()})
            logger.info(
                "remote user pid %d attached from %s (%d remote users)",
                user.pid, request.remote, len(self.users),
            )  # fmt: skip
            async for message in ws:
                if message.type == aiohttp.WSMsgType.BINARY:
                    user.answered(*unframe(message.data))
        except (ValueError, KeyError, TypeError, TimeoutError) as e:
            logger.warning("bad lease from %s: %s", request.remote, type(e).__name__)
        finally:
            if user is not None:
                self.users.pop(user.key, None)
                self.front.remove(user.front_user)
                user.lost()
                self.on_users()
                logger.info("remote user pid %d left (%d remote users)", user.pid, len(self.users))
            await ws.close()
        return ws
