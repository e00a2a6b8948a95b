"""The door: the one service of the host that a stack's containers reach.

On the stack network's gateway address, it passes a container's `POST /ng-rollout/<rollout
id>/v1/...` on to the stack's `policy_model` (which authenticates it by the id's credential),
bytes unchanged both ways; any other path from a container is 404 before anything is read. The
host itself (source address the gateway) may also use the plain routes and the readiness poll
(docs/containers.md).
"""

from __future__ import annotations

import aiohttp
from aiohttp import web

from verifiers_nemogym.bridge import wire
from verifiers_nemogym.net import AppServer

DOOR_CALL_TIMEOUT = 3700.0
"""Seconds the door waits on `policy_model` for one call (which bounds calls itself)."""


class ModelDoor(AppServer):
    """See the module contract. `host`: the gateway address; `upstream`: `http://host:port` of
    the stack's `policy_model`."""

    def __init__(self, host: str, upstream: str, port: int = 0) -> None:
        self.host = host
        self.port = port
        self.upstream = upstream.rstrip("/")
        self.calls = 0
        self.refused = 0

    def _client_timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=DOOR_CALL_TIMEOUT, sock_connect=10.0)

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=wire.MAX_BODY_BYTES)
        app.router.add_route("*", "/{path:.*}", self._forward)
        return app

    def _from_host(self, request: web.Request) -> bool:
        return request.remote == self.host

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        rollout = request.path.startswith("/ng-rollout/") and request.method == "POST"
        if not (rollout or self._from_host(request)):
            self.refused += 1
            return wire.json_error(
                404, "containers may only call their rollout's route", "not_found"
            )
        if request.method == "GET" and request.path == "/":
            return await wire.health(request)
        self.calls += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() in wire.FORWARDED_HEADERS}
        assert self._session is not None
        try:
            async with self._session.request(
                request.method,
                f"{self.upstream}{request.path_qs}",
                data=request.content if request.can_read_body else None,
                headers=headers,
            ) as upstream:
                response = web.StreamResponse(status=upstream.status)
                response.content_type = upstream.content_type or "application/json"
                await response.prepare(request)
                async for piece in upstream.content.iter_any():
                    await response.write(piece)
                await response.write_eof()
                return response
        except (aiohttp.ClientError, TimeoutError) as e:
            return wire.json_error(502, f"the stack's policy_model did not answer: {e!r}", "gone")
