"""The door (containers/door.py) on loopback, between raw sockets and a real aiohttp upstream.

The door listens on 127.0.0.1 (standing for the stack network's gateway, the host's own address
there); a container is a client bound to another loopback address (127.0.0.2, 127.0.0.3), so
the door sees it as the containers see it: not the host. Requests are written as raw bytes over
a socket, so that no client normalises their spelling on the way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from verifiers_nemogym.containers import door as door_module
from verifiers_nemogym.containers.door import ModelDoor

CONTAINER = "127.0.0.2"
NEIGHBOUR = "127.0.0.3"
ROLLOUT = "0123abcd-4.00112233445566778899aabbccddeeff"
"""A rollout id of the shape the proxy gives (`<route>.<credential>`)."""
ROUTE = f"/ng-rollout/{ROLLOUT}/v1/chat/completions"


@dataclass
class Upstream:
    """Stands in for the stack's `policy_model`: records every request it gets, whatever its
    path or method, and answers with bytes a test recognises (or holds a call, `hold`)."""

    seen: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    held: int = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.seen.append((request.method, request.raw_path, dict(request.headers), body))
        if b"hold" in body:
            self.held += 1
            await self.release.wait()
        return web.Response(body=b'{"echo": ' + body + b"}", content_type="application/json")


@contextlib.asynccontextmanager
async def door_and_upstream() -> AsyncIterator[tuple[ModelDoor, Upstream]]:
    upstream = Upstream()
    app = web.Application()
    app.router.add_route("*", "/{anything:.*}", upstream.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with ModelDoor("127.0.0.1", f"http://127.0.0.1:{port}") as door:
            yield door, upstream
    finally:
        upstream.release.set()
        await runner.cleanup()


async def send(
    door: ModelDoor,
    head: str,
    body: bytes = b"{}",
    *,
    source: str = CONTAINER,
    headers: str = "",
    timeout: float = 20.0,
) -> tuple[int, bytes]:
    """Write `head` (the request line) with a few headers and `body` from `source`, as bytes;
    the answer's status (0: the connection closed without one) and body."""
    reader, writer = await asyncio.open_connection(door.host, door.port, local_addr=(source, 0))
    try:
        request = (
            f"{head}\r\nHost: {door.host}:{door.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n{headers}\r\n"
        ).encode("latin-1") + body
        try:
            writer.write(request)
            await writer.drain()
            async with asyncio.timeout(timeout):
                answer = await reader.read()
        except ConnectionResetError:
            answer = b""
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    if not answer:
        return 0, b""
    status = int(answer.split(b" ", 2)[1])
    head, _, rest = answer.partition(b"\r\n\r\n")
    return status, dechunk(rest) if b"transfer-encoding: chunked" in head.lower() else rest


def dechunk(data: bytes) -> bytes:
    """The body of a chunked answer."""
    out = b""
    while True:
        size, _, data = data.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            return out
        out, data = out + data[:n], data[n + 2 :]


SPELLINGS = [
    # dot segments, raw and encoded, in every place
    "/ng-rollout/../v1/chat/completions",
    "/ng-rollout/./v1/chat/completions",
    "/ng-rollout/%2e%2e/v1/chat/completions",
    "/ng-rollout/%2E%2E/v1/chat/completions",
    "/ng-rollout/.%2e/v1/chat/completions",
    "/ng-rollout/%2e./v1/chat/completions",
    f"/ng-rollout/{ROLLOUT}/../../v1/chat/completions",
    f"/ng-rollout/{ROLLOUT}/v1/../../../v1/chat/completions",
    f"/ng-rollout/{ROLLOUT}/./v1/chat/completions",
    f"/ng-rollout/{ROLLOUT}/v1/./chat/completions",
    f"/ng-rollout/{ROLLOUT}/v1/chat/completions/..",
    f"/ng-rollout/{ROLLOUT}/v1/chat/completions/.",
    f"/ng-rollout/{ROLLOUT}/v1/chat/completions.",
    f"/ng-rollout/{ROLLOUT}/v1/chat/completions/",
    # encoded slashes, backslashes, other encodings
    "/ng-rollout/..%2fv1/chat/completions",
    "/ng-rollout/..%2Fv1/chat/completions",
    "/ng-rollout/..%5cv1/chat/completions",
    "/ng-rollout/..%5Cv1/chat/completions",
    "/ng-rollout/..\\v1/chat/completions",
    f"/ng-rollout/{ROLLOUT}%2fv1%2fchat%2fcompletions",
    f"/ng-rollout/{ROLLOUT}/v1/chat%2fcompletions",
    f"/ng-rollout/{ROLLOUT}/v1/%63hat/completions",
    f"/ng-rollout/{ROLLOUT}/v1/chat/completions%00",
    f"/ng-rollout/{ROLLOUT}/v1/chat/completions;x=1",
    # doubled slashes
    f"//ng-rollout/{ROLLOUT}/v1/chat/completions",
    f"/ng-rollout//{ROLLOUT}/v1/chat/completions",
    f"/ng-rollout/{ROLLOUT}//v1/chat/completions",
    f"/ng-rollout/{ROLLOUT}/v1//chat/completions",
    # queries and fragments the route does not use
    f"{ROUTE}?x=1",
    f"{ROUTE}?",
    f"{ROUTE}#x",
    # not the route
    "/v1/chat/completions",
    "/",
    "/ng-rollout/",
    f"/ng-rollout/{ROLLOUT}",
    f"/ng-rollout/{ROLLOUT}/v1/models",
    f"/ng-rollout/{ROLLOUT}/v1/responses/compact",
    f"/NG-ROLLOUT/{ROLLOUT}/v1/chat/completions",
    "/ng-rollout/-x/v1/chat/completions",
    # absolute-form and other request targets
    "http://127.0.0.1/ng-rollout/../v1/chat/completions",
    f"http://127.0.0.1{ROUTE}",
    "*",
]


@pytest.mark.parametrize("target", SPELLINGS)
async def test_every_other_spelling_is_404_and_never_reaches_the_upstream(target: str) -> None:
    """A container's request whose target is not exactly `/ng-rollout/<rollout id>/v1/<known
    endpoint>` gets 404 from the door (`*`: 400, from aiohttp's parser), whatever it hides: the
    upstream sees nothing."""
    async with door_and_upstream() as (door, upstream):
        status, _ = await send(door, f"POST {target} HTTP/1.1")
        assert status == (400 if target == "*" else 404), (target, status)
        assert upstream.seen == [], (target, upstream.seen)


@pytest.mark.parametrize("method", ["GET", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD", "TRACE"])
async def test_every_other_method_on_the_route_is_404(method: str) -> None:
    async with door_and_upstream() as (door, upstream):
        status, _ = await send(door, f"{method} {ROUTE} HTTP/1.1")
        assert status == 404, (method, status)
        assert upstream.seen == []


@pytest.mark.parametrize(
    "header",
    [
        "X-Original-URL: /v1/chat/completions",
        "X-Rewrite-URL: /v1/chat/completions",
        "X-HTTP-Method-Override: POST",
        "X-Forwarded-Prefix: /ng-rollout/x",
        "X-Forwarded-For: 127.0.0.1",
        "Forwarded: for=127.0.0.1",
    ],
)
async def test_headers_change_nothing(header: str) -> None:
    """A header naming another path, method or source changes nothing: a wrong path is 404,
    and on the route the header is not passed on."""
    async with door_and_upstream() as (door, upstream):
        status, _ = await send(door, "POST /ng-rollout/../v1/chat/completions HTTP/1.1",
                               headers=f"{header}\r\n")  # fmt: skip
        assert status == 404 and upstream.seen == []
        status, _ = await send(door, f"GET {ROUTE} HTTP/1.1", headers=f"{header}\r\n")
        assert status == 404 and upstream.seen == []
        status, _ = await send(door, f"POST {ROUTE} HTTP/1.1", headers=f"{header}\r\n")
        assert status == 200
        ((_, _, seen_headers, _),) = upstream.seen
        assert header.split(":")[0].lower() not in {k.lower() for k in seen_headers}


async def test_a_refusal_comes_before_the_body_is_read() -> None:
    """A request announcing 64 MB on another path is answered 404 without the door waiting for
    a byte of its body."""
    async with door_and_upstream() as (door, upstream):
        reader, writer = await asyncio.open_connection(
            door.host, door.port, local_addr=(CONTAINER, 0)
        )
        try:
            writer.write(
                b"POST /ng-rollout/../v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: 67108864\r\n\r\n"
            )
            async with asyncio.timeout(10):
                line = await reader.readline()
        finally:
            writer.close()
        assert line.startswith(b"HTTP/1.1 404"), line
        assert upstream.seen == []


@pytest.mark.parametrize(
    "tail", ["chat/completions", "responses", "messages", "messages?beta=true"]
)
async def test_the_rollout_route_passes_bytes_unchanged(tail: str) -> None:
    """The rollout's own route reaches the upstream at that path (no query), with the body and
    the answer byte for byte, and only the headers the proxy reads."""
    body = b'{"model":"m",  "input":"\\u00e9 \xc3\xa9"}'
    async with door_and_upstream() as (door, upstream):
        target = f"/ng-rollout/{ROLLOUT}/v1/{tail}"
        status, answer = await send(
            door, f"POST {target} HTTP/1.1", body,
            headers="Authorization: Bearer b\r\nX-VF-NeMoGym-Route: r\r\nCookie: c=1\r\n",
        )  # fmt: skip
        assert status == 200 and answer == b'{"echo": ' + body + b"}"
        ((method, path, headers, seen),) = upstream.seen
        assert (method, path, seen) == ("POST", target.split("?")[0], body)
        assert {k.lower() for k in headers} >= {"authorization", "x-vf-nemogym-route"}
        assert "cookie" not in {k.lower() for k in headers}


async def test_the_host_has_its_plain_routes_and_readiness_and_nothing_else() -> None:
    """From the host's own address: `GET /` answers readiness, `POST /v1/<endpoint>` and the
    rollout route pass; dot segments are 404 there too."""
    async with door_and_upstream() as (door, upstream):
        status, answer = await send(door, "GET / HTTP/1.1", source=door.host)
        assert status == 200 and json.loads(answer) == {"status": "ok"}
        assert (await send(door, "POST /v1/responses HTTP/1.1", source=door.host))[0] == 200
        assert (await send(door, f"POST {ROUTE} HTTP/1.1", source=door.host))[0] == 200
        assert [path for _, path, _, _ in upstream.seen] == ["/v1/responses", ROUTE]
        for target in ("/ng-rollout/../v1/responses", "/v1/../v1/responses", "/v1/models"):
            assert (await send(door, f"POST {target} HTTP/1.1", source=door.host))[0] == 404
        assert len(upstream.seen) == 2


async def test_one_container_holding_calls_cannot_take_the_places_of_another() -> None:
    """A container holding `DOOR_CONNECTIONS_PER_ADDRESS` calls upstream has its next
    connection closed unread, while another container's call passes at once; the held calls
    are answered when the upstream answers."""
    limit = door_module.DOOR_CONNECTIONS_PER_ADDRESS
    async with door_and_upstream() as (door, upstream):
        held = [
            asyncio.ensure_future(send(door, f"POST {ROUTE} HTTP/1.1", b'"hold"', timeout=60))
            for _ in range(limit)
        ]
        async with asyncio.timeout(20):
            while upstream.held < limit:
                await asyncio.sleep(0.05)
        assert await send(door, f"POST {ROUTE} HTTP/1.1", timeout=10) == (0, b"")
        assert door.gate.turned_away == 1
        status, answer = await send(door, f"POST {ROUTE} HTTP/1.1", b"{}", source=NEIGHBOUR)
        assert (status, answer) == (200, b'{"echo": {}}')
        upstream.release.set()
        assert [status for status, _ in await asyncio.gather(*held)] == [200] * limit
        assert len(upstream.seen) == limit + 1


async def test_a_stalled_body_is_408(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body that stops coming is answered 408 after `DOOR_READ_TIMEOUT`, its place freed."""
    monkeypatch.setattr(door_module, "DOOR_READ_TIMEOUT", 1.0)
    async with door_and_upstream() as (door, _):
        reader, writer = await asyncio.open_connection(
            door.host, door.port, local_addr=(CONTAINER, 0)
        )
        try:
            writer.write(
                f"POST {ROUTE} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{".encode()
            )
            async with asyncio.timeout(20):
                answer = await reader.read()
        finally:
            writer.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        async with asyncio.timeout(10):
            while door.gate.budget.used:
                await asyncio.sleep(0.05)
