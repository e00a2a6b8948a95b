"""NeMoGymModelProxy: the `policy_model` NeMo Gym sees, routing every call to its rollout.

Each call must carry the proxy's secret and a route id (both inside the Responses body's
`metadata`, which NeMo Gym forwards on every turn, or as headers). It is forwarded to that route's
upstream endpoint with that route's bearer secret, and always answered with an HTTP status:
NeMo Gym's client retries dropped connections forever. The proxy knows no NeMo Gym or verifiers
internals beyond the two wire disagreements it bridges (see `_reply`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pydantic_core
from aiohttp import web

from verifiers_nemogym.bridge.responses import complete_response, incomplete_response

logger = logging.getLogger(__name__)

ROUTE_KEY = "vf_nemogym_route"
"""Metadata key (or `X-VF-NeMoGym-Route` header) carrying the per-rollout route id."""
SECRET_KEY = "vf_nemogym_secret"
"""Metadata key (or `Authorization: Bearer` header) carrying the proxy's secret."""
ROUTE_HEADER = "X-VF-NeMoGym-Route"


@dataclass(frozen=True)
class ProxyLimits:
    """Explicit bounds; every one is a failure mode seen in earlier integrations."""

    max_body_bytes: int = 256 * 1024 * 1024
    """Largest request body accepted (413 above it). NeMo Gym resends the whole conversation."""
    pool_size: int = 1024
    """Upstream connections kept open at most, across all routes."""
    connect_timeout: float = 10.0
    """Seconds to connect to an upstream endpoint."""
    call_timeout: float = 3600.0
    """Seconds one model call may take upstream before the proxy answers 504."""
    remembered_routes: int = 100_000
    """Finished route ids remembered, so their late calls get 410 rather than 404."""


@dataclass
class _Route:
    endpoint: str
    secret: str
    session: aiohttp.ClientSession
    calls: int = 0


def route_metadata(route_id: str, secret: str) -> dict[str, str]:
    """The metadata entries that route a Responses body to `route_id` through the proxy whose
    secret is `secret` (for callers in another process than the proxy)."""
    return {ROUTE_KEY: route_id, SECRET_KEY: secret}


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind}}, status=status)


class NeMoGymModelProxy:
    """An aiohttp server on `host` routing model calls per rollout. Use `async with`, or
    `start()`/`stop()`. Routes are opened with `route()` (or `open_route`/`close_route`)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        secret: str | None = None,
        limits: ProxyLimits | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.secret = secret or secrets.token_urlsafe(32)
        self.limits = limits or ProxyLimits()
        self.calls = 0
        """Model calls forwarded upstream since start (any outcome)."""
        self._routes: dict[str, _Route] = {}
        self._finished: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._runner: web.AppRunner | None = None
        self._connector: aiohttp.TCPConnector | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        """Bind and serve; `port` is the bound port afterwards (0 picks a free one)."""
        app = web.Application(client_max_size=self.limits.max_body_bytes)
        app.router.add_get("/", self._health)
        app.router.add_post("/v1/{tail:.*}", self._forward)
        self._connector = aiohttp.TCPConnector(limit=self.limits.pool_size)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=4096)
        await site.start()
        self.port = self._runner.addresses[0][1]
        logger.info("model proxy listening on %s", self.url)

    async def stop(self) -> None:
        """Close every route and the server. Idempotent."""
        for route_id in list(self._routes):
            await self.close_route(route_id)
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if self._connector is not None:
            connector, self._connector = self._connector, None
            await connector.close()

    async def __aenter__(self) -> NeMoGymModelProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- routes ---------------------------------------------------------------------------

    def open_route(self, endpoint: str, secret: str, route_id: str | None = None) -> str:
        """Route calls tagged with the returned id to `endpoint` (a base URL ending in `/v1`)
        with `Authorization: Bearer <secret>`. Each route keeps its own cookies."""
        if self._connector is None:
            raise RuntimeError("NeMoGymModelProxy.open_route() before start()")
        route_id = route_id or secrets.token_urlsafe(16)
        if route_id in self._routes:
            raise ValueError(f"route {route_id!r} is already open")
        session = aiohttp.ClientSession(
            connector=self._connector,
            connector_owner=False,
            # unsafe: endpoints are IP addresses (loopback), whose cookies aiohttp drops otherwise.
            cookie_jar=aiohttp.CookieJar(unsafe=True),
            timeout=aiohttp.ClientTimeout(
                total=self.limits.call_timeout, connect=self.limits.connect_timeout
            ),
        )
        self._routes[route_id] = _Route(endpoint.rstrip("/"), secret, session)
        return route_id

    async def close_route(self, route_id: str) -> int:
        """Stop routing `route_id` (late calls get 410); returns how many calls it carried."""
        route = self._routes.pop(route_id, None)
        if route is None:
            return 0
        self._finished[route_id] = None
        while len(self._finished) > self.limits.remembered_routes:
            self._finished.popitem(last=False)
        await route.session.close()
        return route.calls

    @contextlib.asynccontextmanager
    async def route(self, endpoint: str, secret: str) -> AsyncIterator[str]:
        """A route open for the duration of the block (closed even on cancellation)."""
        route_id = self.open_route(endpoint, secret)
        try:
            yield route_id
        finally:
            await asyncio.shield(self.close_route(route_id))

    def metadata(self, route_id: str) -> dict[str, str]:
        """The metadata entries that make a Responses body reach `route_id` through this proxy."""
        return route_metadata(route_id, self.secret)

    @property
    def open_routes(self) -> int:
        return len(self._routes)

    # --- handlers -------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        # NeMo Gym polls every server's `GET /` for readiness, without credentials.
        return web.json_response({"status": "ok"})

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(
                413, f"body exceeds {self.limits.max_body_bytes} bytes", "request_too_large"
            )
        try:
            body = pydantic_core.from_json(raw)
        except ValueError as e:
            return _error(400, f"body is not JSON: {e}", "invalid_request_error")
        if not isinstance(body, dict):
            return _error(400, "body must be a JSON object", "invalid_request_error")
        metadata = body["metadata"] if isinstance(body.get("metadata"), dict) else {}
        secret = metadata.pop(SECRET_KEY, None) or _bearer(request)
        if not isinstance(secret, str) or not hmac.compare_digest(secret, self.secret):
            return _error(401, "missing or wrong proxy secret", "unauthorized")
        route_id = metadata.pop(ROUTE_KEY, None) or request.headers.get(ROUTE_HEADER)
        route = self._routes.get(route_id) if isinstance(route_id, str) else None
        if route is None:
            if route_id in self._finished:
                return _error(410, f"route {route_id!r} has finished", "route_finished")
            return _error(404, f"unknown route {route_id!r}", "unknown_route")
        if "metadata" in body and not metadata:
            del body["metadata"]  # it held only our routing keys
        route.calls += 1
        self.calls += 1
        return await self._call(route, request.match_info["tail"], body)

    async def _call(self, route: _Route, tail: str, body: dict[str, Any]) -> web.Response:
        url = f"{route.endpoint}/{tail}"
        headers = {
            # Built from scratch on purpose: nothing the agent sent (cookies, auth, hop headers)
            # reaches the endpoint except the body; the route supplies the credentials.
            "Authorization": f"Bearer {route.secret}",
            "Content-Type": "application/json",
        }
        try:
            async with route.session.post(
                url, data=pydantic_core.to_json(body), headers=headers
            ) as upstream:
                raw = await upstream.read()
                status = upstream.status
        except TimeoutError:
            return _error(504, f"upstream {url} did not answer in time", "upstream_timeout")
        except (aiohttp.ClientError, RuntimeError) as e:
            # RuntimeError: the route's session was closed under an in-flight call.
            return _error(502, f"upstream {url} failed: {e!r}", "upstream_error")
        return _reply(status, raw, body, is_responses=tail == "responses")


def _bearer(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    return auth[7:] if auth.startswith("Bearer ") else None


def _reply(status: int, raw: bytes, request: dict[str, Any], *, is_responses: bool) -> web.Response:
    """The upstream answer, bridged to what NeMo Gym's agents accept."""
    try:
        payload = pydantic_core.from_json(raw)
    except ValueError:
        payload = None
    if status == 200:
        if not isinstance(payload, dict):
            return _error(502, "upstream answered 200 with a non-JSON body", "upstream_error")
        if is_responses:
            payload = complete_response(payload, request)
        return _json(payload)
    if is_responses and _ended_rollout(status, payload):
        # verifiers refuses further calls once a rollout stopped (turn limit, @vf.stop) or
        # concluded. NeMo Gym's agent would raise and never verify; an `incomplete` reply
        # makes it end its loop and verify what was done, so the reward is kept.
        return _json(incomplete_response(request, _message(payload)))
    if isinstance(payload, dict):
        return _json(payload, status)
    text = raw[:2000].decode(errors="replace")
    return _error(status, f"upstream answered {status}: {text}", "upstream_error")


def _message(payload: Any) -> str:
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict):
            return str(error.get("message", ""))
        if error is not None:
            return str(error)
    return ""


def _ended_rollout(status: int, payload: Any) -> bool:
    if status in (401, 409):
        return True
    return status == 400 and _message(payload).startswith("rollout stopped")


def _json(obj: Any, status: int = 200) -> web.Response:
    # Bytes straight from pydantic_core: json_response would decode them to str and back.
    return web.Response(
        body=pydantic_core.to_json(obj), status=status, content_type="application/json"
    )
