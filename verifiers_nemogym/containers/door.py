"""The door: the one service of the host that a stack's containers reach.

On the stack network's gateway address, it passes a container's request on to the stack's
`policy_model` (which authenticates it by the rollout id's credential), bytes unchanged both ways,
only when it is `POST /ng-rollout/<rollout id>/v1/<endpoint>` spelled exactly so (`<endpoint>` one
of `wire.MODEL_ENDPOINTS`; `?beta=true`, which the Anthropic SDK adds, on `messages` only): the
request target as sent, not as any parser would normalise it. Anything else (dot segments, raw or
percent-encoded; any percent-encoding, backslash, doubled slash or other query; an absolute-form
target; another method) is 404 before a byte of its body is read. The call goes upstream at a URL
rebuilt from the parts checked, which no client re-normalises. The host itself (source address
the gateway) may also use `GET /` (readiness) and the plain `POST /v1/<endpoint>` routes, spelled
as strictly (docs/containers.md).

Connections are bounded (`wire.ConnectionGate`): `DOOR_CONNECTIONS_PER_ADDRESS` open at once
from one container (one beyond is closed unread), `DOOR_CONNECTIONS` from all (one beyond waits,
unread, for a free place); each is closed after its answer, and a body that stalls for
`DOOR_READ_TIMEOUT` is answered 408. So one container holding slow calls cannot take the places
of the others' model calls (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from yarl import URL

from verifiers_nemogym.bridge import wire
from verifiers_nemogym.net import AppServer

DOOR_CALL_TIMEOUT = 3700.0
"""Seconds the door waits on `policy_model` for one call (which bounds calls itself)."""
DOOR_CONNECTIONS = 256
"""Connections the door serves at once, from all containers; one beyond waits for a place."""
DOOR_CONNECTIONS_PER_ADDRESS = 8
"""Connections one container (source address) may hold open at once; one beyond is closed.
OpenCode makes one model call at a time per session, two with its title call."""
DOOR_READ_TIMEOUT = 30.0
"""Seconds a request body may stall between two reads before the call is answered 408."""

_ENDPOINT = "|".join(re.escape(tail) for tail in wire.MODEL_ENDPOINTS)
_ROLLOUT_PATH = re.compile(rf"/ng-rollout/([A-Za-z0-9][A-Za-z0-9._-]*)/v1/({_ENDPOINT})")
"""The rollout route, whole: a rollout id is one segment of `wire.ROLLOUT_ID_PATTERN`'s
characters starting with a letter or digit (so never `.` or `..`); nothing percent-encoded."""
_PLAIN_PATH = re.compile(rf"/v1/({_ENDPOINT})")
_QUERIES = {"messages": frozenset({"", "beta=true"})}
"""Query strings a route may carry, by endpoint (none: only no query). Not passed on: the
proxy reads none."""


def route_target(raw_target: str, *, plain: bool) -> str | None:
    """The path to send upstream for a request target as sent (`raw_target`: path and query,
    undecoded), or None if it is not one of the routes spelled exactly (module doc). `plain`:
    the plain `/v1/<endpoint>` routes count too (the host's calls)."""
    path, question, query = raw_target.partition("?")
    if (match := _ROLLOUT_PATH.fullmatch(path)) is not None:
        rollout, tail = match.groups()
        target = f"/ng-rollout/{rollout}/v1/{tail}"
    elif plain and (match := _PLAIN_PATH.fullmatch(path)) is not None:
        (tail,) = match.groups()
        target = f"/v1/{tail}"
    else:
        return None
    if question and query not in _QUERIES.get(tail, ()):
        return None
    return target


class _StalledBody(Exception):
    """A container's body stalled for `DOOR_READ_TIMEOUT`."""


class ModelDoor(AppServer):
    """See the module contract. `host`: the gateway address; `upstream`: `http://host:port` of
    the stack's `policy_model`. `calls` counts the calls passed on, `refused` the 404s."""

    def __init__(self, host: str, upstream: str, port: int = 0) -> None:
        self.host = host
        self.port = port
        self.upstream = upstream.rstrip("/")
        self.calls = 0
        self.refused = 0
        self.gate = wire.ConnectionGate(
            wire.ByteBudget(DOOR_CONNECTIONS),
            allowance=1,
            per_address=DOOR_CONNECTIONS_PER_ADDRESS,
            unbounded=frozenset({host}),
        )
        """Never admits a caller: every connection holds its place until it closes."""

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=DOOR_CONNECTIONS),
            timeout=aiohttp.ClientTimeout(total=DOOR_CALL_TIMEOUT, sock_connect=10.0),
        )
        await super().start()

    def _gate(self) -> wire.ConnectionGate:
        return self.gate

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=wire.MAX_BODY_BYTES)
        app.router.add_route("*", "/{path:.*}", self._forward)
        return app

    def _from_host(self, request: web.Request) -> bool:
        return request.remote == self.host

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        from_host = self._from_host(request)
        if from_host and request.method == "GET" and request.raw_path == "/":
            return await wire.health(request)
        target = route_target(request.raw_path, plain=from_host)
        if request.method != "POST" or target is None:
            self.refused += 1
            return wire.json_error(
                404, "containers may only call their rollout's route", "not_found"
            )
        self.calls += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() in wire.FORWARDED_HEADERS}
        assert self._session is not None
        stalled: list[bool] = []
        try:
            async with self._session.post(
                # encoded=True: the URL goes out as checked, with no second normalisation.
                URL(f"{self.upstream}{target}", encoded=True),
                data=_body(request, stalled) if request.can_read_body else None,
                headers=headers,
            ) as upstream:
                response = web.StreamResponse(status=upstream.status)
                response.content_type = upstream.content_type or "application/json"
                await response.prepare(request)
                async for piece in upstream.content.iter_any():
                    await response.write(piece)
                await response.write_eof()
                return response
        except (aiohttp.ClientError, TimeoutError, _StalledBody) as e:
            if stalled:
                message = f"the request body stalled for {DOOR_READ_TIMEOUT:g} s"
                return wire.json_error(408, message, "request_timeout")
            return wire.json_error(502, f"the stack's policy_model did not answer: {e!r}", "gone")


async def _body(request: web.Request, stalled: list[bool]) -> AsyncIterator[bytes]:
    """The request's body as it comes, each read bounded by `DOOR_READ_TIMEOUT` (a stall is
    recorded in `stalled` and ends the upload)."""
    while True:
        try:
            async with asyncio.timeout(DOOR_READ_TIMEOUT):
                piece = await request.content.readany()
        except TimeoutError:
            stalled.append(True)
            raise _StalledBody from None
        if not piece:
            return
        yield piece
