"""The front forwarder: NeMo Gym's `policy_model` for a shared stack.

It passes every model call on, bytes unchanged, to the registered proxy whose secret the call
carries (or, on an `/ng-rollout/<id>/` path, whose secret made the id's credential, checked before
the body is read; `bridge.wire`): no or an unknown secret is 401, a proxy that stopped answering
410, and nothing else is read from the body (docs/shared-stacks.md).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from verifiers_nemogym.bridge import wire
from verifiers_nemogym.bridge.wire import secret_digest
from verifiers_nemogym.net import LOOPBACK, AppServer, forward, forwarding_session

UNKNOWN_SECRET = "missing or unknown proxy secret"
FRONT_CALL_TIMEOUT = 3700.0
"""Seconds the front waits for a proxy's answer: the proxy bounds each call itself
(`ProxyLimits.call_timeout`, one hour); this only caps a proxy that stopped answering without
closing its connection."""


@dataclass
class FrontUser:
    """A registered env process: its proxy's URL and the digest of its proxy's secret."""

    pid: int
    proxy_url: str
    secret_digest: bytes


class FrontForwarder(AppServer):
    """See the module contract. `add`/`remove` register the proxies of the stack's users."""

    def __init__(
        self,
        host: str = LOOPBACK,
        port: int = 0,
        *,
        pool_size: int = 1024,
        connect_timeout: float = 10.0,
    ) -> None:
        self.host = host
        self.port = port
        self.pool_size = pool_size
        """Connections to the proxies open at most; a call beyond waits for one."""
        self.connect_timeout = connect_timeout
        """Seconds a new connection to a proxy may take (the wait for a free one is not
        counted)."""
        self.users: dict[bytes, FrontUser] = {}
        self.calls = 0
        self._http: aiohttp.ClientSession | None = None
        self._bodies = wire.BodyReader()
        """Reads call bodies in bounded memory until their secret is known (`wire.BodyReader`)."""

    def _gate(self) -> wire.ConnectionGate:
        return self._bodies.gate

    def _app(self) -> web.Application:
        return wire.model_call_app(self._forward)

    async def start(self) -> None:
        # sock_connect, not connect: a call beyond the pool waits for a free connection;
        # aiohttp's `connect` would fail it after the bound, as if its env process were gone.
        timeout = aiohttp.ClientTimeout(total=FRONT_CALL_TIMEOUT, sock_connect=self.connect_timeout)
        self._http = forwarding_session(timeout, limit=self.pool_size)
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        if self._http is not None:
            http, self._http = self._http, None
            await http.close()

    def add(self, user: FrontUser) -> None:
        self.users[user.secret_digest] = user

    def remove(self, user: FrontUser) -> None:
        if self.users.get(user.secret_digest) is user:
            del self.users[user.secret_digest]

    def _user_for(self, secret: bytes) -> FrontUser | None:
        digest = secret_digest(secret)
        user = self.users.get(digest)
        # The digest lookup already matched; compare_digest keeps the check constant-time.
        if user is None or not hmac.compare_digest(digest, user.secret_digest):
            return None
        return user

    def _knows(self, secret: bytes) -> bool:
        return self._user_for(secret) is not None

    def _user_of_rollout(self, path_id: str) -> FrontUser | None:
        """The user whose proxy gave this rollout id its credential (`wire.rollout_id`)."""
        return next(
            (u for u in self.users.values() if wire.rollout_route(path_id, u.secret_digest)), None
        )

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        # A rollout's own path: its credential picks the user before the body is read.
        path_id = request.match_info.get("rollout_id")
        user = self._user_of_rollout(path_id) if path_id is not None else None
        if path_id is not None and user is None:
            return wire.json_error(401, "missing or unknown rollout credential", "unauthorized")
        # Otherwise the user is picked by the secret the call carries (never by parsing it);
        # until one is found, its body is read within the unauthenticated budget.
        accepts = None if user is not None else self._knows
        body = await self._bodies.read(request, accepts, unauthorized=UNKNOWN_SECRET)
        if body.refusal is not None:
            return body.refusal
        if user is None:
            assert body.secret is not None
            user = self._user_for(body.secret)
            if user is None:  # its lease ended while the body was read
                return wire.json_error(401, UNKNOWN_SECRET, "unauthorized")
        raw = body.raw
        self.calls += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() in wire.FORWARDED_HEADERS}
        assert self._http is not None
        try:
            # The path is kept: `/ng-rollout/<id>/v1/...` names the rollout to the proxy too.
            answer = await forward(self._http, f"{user.proxy_url}{request.path_qs}", raw, headers)
        except (aiohttp.ClientError, TimeoutError) as e:
            return wire.json_error(
                410, f"the env process (pid {user.pid}) owning this call is gone: {e!r}", "gone"
            )
        return answer.response()
