"""The model-call wire NeMo Gym's agents speak to `policy_model`, defined once for both servers
that stand as it (`bridge.proxy`, `bridge.front`).

A model call is `POST /ng-rollout/<rollout id>/v1/<tail>` (the id is `rollout_id(route, secret)`,
authenticating the call by its path before the body is read), or `POST /v1/<tail>` carrying
`SECRET_KEY` and `ROUTE_KEY` in its body's `metadata` (or as `Authorization: Bearer` and
`ROUTE_HEADER`); `<tail>` is `responses`, `chat/completions` or `messages`. `GET /` answers
readiness without credentials. Every listener of ours reads connections through a
`ConnectionGate` and bodies through a `BodyReader`, in bounded memory until its caller is
authenticated (docs/reliability.md, "Memory a caller without a credential can take").
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import email.utils
import hashlib
import hmac
import math
import re
import tempfile
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, ClassVar

from aiohttp import web

ROUTE_KEY = "vf_nemogym_route"
"""Metadata key (or `ROUTE_HEADER` header) carrying the per-rollout route id."""
SECRET_KEY = "vf_nemogym_secret"
"""Metadata key (or `Authorization: Bearer` header) carrying the proxy's secret."""
ROUTE_HEADER = "X-VF-NeMoGym-Route"
ROLLOUT_ID_KEY = "_ng_rollout_id"
"""Row key NeMo Gym (>= 0.7) reads as the rollout's id: with observability or token capture on,
its agents call the policy at `/ng-rollout/<id>/v1/...`. Tagged rows carry the route id there."""
ROLLOUT_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
"""What NeMo Gym accepts as a rollout id (a path segment); every route id matches it."""
MAX_BODY_BYTES = 256 * 1024 * 1024
"""Largest model-call body accepted (long multi-turn prompts with tool outputs run to MBs)."""
MODEL_ENDPOINTS = ("responses", "chat/completions", "messages")
"""The `<tail>`s of a model call NeMo Gym's agents and the coding-agent CLIs make."""
FORWARDED_HEADERS = frozenset({"content-type", "authorization", ROUTE_HEADER.lower()})
"""Request headers the front passes on to the owning proxy (the rest are hop-by-hop)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def secret_digest(secret: str | bytes) -> bytes:
    """What a front keeps of a proxy's secret (never the secret itself); also the key of the
    proxy's rollout credentials (`rollout_id`), so a front can check them too."""
    return hashlib.sha256(secret.encode() if isinstance(secret, str) else secret).digest()


def rollout_id(route_id: str, proxy_secret: str) -> str:
    """NeMo Gym's rollout id for a route: `<route id>.<credential>`, the credential an HMAC of
    the route id under the proxy's secret digest. It rides in the path of every call NeMo Gym's
    agents (and the coding-agent CLIs they run) make for the rollout, which is all a CLI carries:
    the path alone routes and authenticates such a call, before its body is read."""
    return f"{route_id}.{_credential(route_id, secret_digest(proxy_secret))}"


def _credential(route_id: str, digest: bytes) -> str:
    return hmac.new(digest, route_id.encode(), hashlib.sha256).hexdigest()[:32]


def rollout_route(path_id: str, digest: bytes) -> str | None:
    """The route id of a path's rollout id if its credential is the one the proxy of `digest`
    gives (`rollout_id`), else None (compared in constant time)."""
    route_id, dot, credential = path_id.rpartition(".")
    if not dot or not route_id:
        return None
    return route_id if hmac.compare_digest(credential, _credential(route_id, digest)) else None


def route_metadata(route_id: str, proxy_secret: str) -> dict[str, str]:
    """The `metadata` entries that send a Responses body to one route of one proxy (also what
    a process other than the proxy's builds from the two values, e.g. the benchmarks)."""
    return {ROUTE_KEY: route_id, SECRET_KEY: proxy_secret}


def tag_row(row: dict[str, Any], route_id: str, proxy_secret: str) -> dict[str, Any]:
    """A copy of the NeMo Gym `row` whose model calls go to that route: the routing entries in
    `responses_create_params.metadata` (NeMo Gym forwards it on every model call), and the
    route's `rollout_id` as NeMo Gym's rollout id (its `/ng-rollout/<id>/v1/...` calls)."""
    params = row["responses_create_params"]
    metadata = {**(params.get("metadata") or {}), **route_metadata(route_id, proxy_secret)}
    tagged = {**row, "responses_create_params": {**params, "metadata": metadata}}
    tagged[ROLLOUT_ID_KEY] = rollout_id(route_id, proxy_secret)
    return tagged


def model_call_app(forward: Handler, *, max_body_bytes: int = MAX_BODY_BYTES) -> web.Application:
    """An aiohttp app answering NeMo Gym's readiness poll and sending every model-call route
    to `forward` (`request.match_info["tail"]`, and `["rollout_id"]` on the prefixed route)."""
    app = web.Application(client_max_size=max_body_bytes)
    app.router.add_get("/", health)
    app.router.add_post("/v1/{tail:.*}", forward)
    app.router.add_post("/ng-rollout/{rollout_id}/v1/{tail:.*}", forward)
    return app


async def health(request: web.Request) -> web.Response:
    """NeMo Gym polls every server's `GET /` for readiness, without credentials."""
    return web.json_response({"status": "ok"})


_SECRET_IN_BODY = re.compile(
    rb'"' + SECRET_KEY.encode() + rb'"\s{0,16}:\s{0,16}"([A-Za-z0-9_-]{1,128})"'
)
_ROUTE_IN_BODY = re.compile(
    rb'"' + ROUTE_KEY.encode() + rb'"\s{0,16}:\s{0,16}"([A-Za-z0-9._-]{1,128})"'
)
_ENTRY_MAX = 256
"""Longest entry the two patterns match (so the last this many bytes of a body read so far hold
any entry cut between two reads)."""
_SECRETS_LOOKED_AT = 4
"""How many secret-shaped entries of one body are tried (a body may quote an earlier turn)."""

UNAUTHENTICATED_BUDGET = 16 * 1024 * 1024
"""Bytes a process's listeners hold in memory for all their callers not (yet) authenticated
together, whatever their number and sizes: `CONNECTIONS_SHARE` for aiohttp's own buffers of
the connections being read (`ConnectionGate`), the rest for the bodies read (`BodyReader`)."""
CONNECTIONS_SHARE = 8 * 1024 * 1024
"""The part of `UNAUTHENTICATED_BUDGET` for connections whose caller is not yet admitted."""
CONNECTION_ALLOWANCE = 1024 * 1024
"""Bytes one connection not yet admitted may make aiohttp hold (request head, about 0.65 MB
with aiohttp's copies; payload buffer, 128 KiB; one socket read, 256 KiB)."""
HEAD_LIMITS = {"max_line_size": 8190, "max_field_size": 4096, "max_headers": 64}
"""aiohttp's request-head limits for our listeners (400 beyond); the agents' SDKs send under 30
lines of well under 1 KiB each."""
READ_CHUNK = 64 * 1024
"""Bytes read from a body at a time (what one reader takes from the budget per read)."""
KEPT_IN_MEMORY = 1024 * 1024
"""Bytes of one unauthenticated body kept in memory before it goes to a temporary file."""
SPOOLED_BUDGET = 4 * 1024**3
"""Bytes of bodies not (yet) authenticated a process keeps in temporary files at once; a caller
that would pass it is answered 503 (NeMo Gym's client tries again): no caller fills the disk."""
UNAUTHENTICATED_READ_TIMEOUT = 30.0
"""Seconds a caller not yet authenticated may take per `READ_CHUNK` (waiting for the budget
included): a trickling caller cannot hold a share of the budget for long (408)."""


class ByteBudget:
    """At most `limit` bytes taken at once: `take(n)` waits (first come, first served) until
    `n` are free, `give(n)` returns them. Not bound to an event loop until first waited on."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        """Most bytes ever taken at once (what tests read)."""
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def try_take(self, n: int) -> bool:
        """Take `n` now if free and nobody waits before us."""
        if self._waiters or self.used + n > self.limit:
            return False
        self._grant(n)
        return True

    async def take(self, n: int) -> None:
        if n > self.limit:
            raise ValueError(f"{n} bytes can never fit a budget of {self.limit}")
        if self.try_take(n):
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append((n, waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give(n)  # granted as we were cancelled: not ours to keep
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove((n, waiter))
                self.give(0)  # those queued behind us may fit now
            raise

    def give(self, n: int) -> None:
        self.used -= n
        while self._waiters and self.used + self._waiters[0][0] <= self.limit:
            wanted, waiter = self._waiters.popleft()
            if not waiter.done():  # cancelled, its `take` not yet resumed: skipped
                self._grant(wanted)
                waiter.set_result(None)

    def _grant(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)


class ConnectionGate:
    """Reads a listener's connections whose caller is not yet admitted only while they hold a
    `CONNECTION_ALLOWANCE` from `budget` (taken before the first byte is read; when it is spent
    the transport pauses, first come first served), so what aiohttp buffers for them is at most
    `budget.limit`. `admitted(request)` gives the allowance back; a connection answered without
    being admitted is closed after the answer. Serve through it with
    `net.serve_app(..., gate=...)`.

    `per_address`: besides, at most this many connections open at once from one source address
    (admitted or not, holding or awaiting an allowance); one beyond is closed before a byte of
    it is read (`turned_away` counts them). Addresses in `unbounded` have no such bound. A
    listener none of whose callers is ever admitted (the containers' door) bounds its
    connections in number this way: `budget` counts them, `allowance=1`."""

    def __init__(
        self,
        budget: ByteBudget,
        allowance: int = CONNECTION_ALLOWANCE,
        *,
        per_address: int | None = None,
        unbounded: frozenset[str] = frozenset(),
    ) -> None:
        self.budget = budget
        self.allowance = allowance
        self.per_address = per_address
        self.unbounded = unbounded
        self.turned_away = 0
        self._holding: set[asyncio.BaseProtocol] = set()
        """aiohttp handlers (one per connection) holding an allowance."""
        self._waiting: dict[asyncio.BaseProtocol, asyncio.Task[None]] = {}
        """Handlers whose transport is paused until an allowance is free."""
        self._sources: dict[asyncio.BaseProtocol, str] = {}
        """Handlers counted against their source address (`per_address`)."""
        self._open_from: collections.Counter[str] = collections.Counter()

    handler_args: ClassVar[Mapping[str, Any]] = {
        **HEAD_LIMITS,
        "keepalive_timeout": UNAUTHENTICATED_READ_TIMEOUT,
    }
    """aiohttp request-handler options for listeners behind a gate (`web.AppRunner` kwargs)."""

    def protocol_factory(
        self, inner: Callable[[], asyncio.BaseProtocol]
    ) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for the listening socket: aiohttp's `inner` handlers, gated."""
        return lambda: _GatedConnection(inner(), self)

    def holds(self, request: web.BaseRequest) -> bool:
        """Whether the connection of `request` is not admitted (holds or awaits an allowance)."""
        handler = request.protocol
        return handler in self._holding or handler in self._waiting

    def admitted(self, request: web.BaseRequest) -> None:
        """The caller of `request` is admitted: its connection is read freely from now on."""
        self._leave(request.protocol)

    async def on_response_prepare(self, request: web.BaseRequest, response: Any) -> None:
        """`web.Application.on_response_prepare`: an answer to a caller not admitted closes its
        connection (which gives its allowance back) rather than keep it open for another."""
        if self.holds(request):
            response.force_close()
            # aiohttp writes its `Connection` header before this signal: told here, the client
            # does not send its next call on a connection about to close.
            response.headers["Connection"] = "close"

    def _opened(self, handler: asyncio.BaseProtocol, transport: asyncio.BaseTransport) -> None:
        if self.per_address is not None:
            peer = transport.get_extra_info("peername")
            source = str(peer[0]) if isinstance(peer, tuple) and peer else ""
            if source not in self.unbounded:
                if self._open_from[source] >= self.per_address:
                    self.turned_away += 1
                    transport.close()  # before its first read: nothing of it is buffered here
                    return
                self._open_from[source] += 1
                self._sources[handler] = source
        if self.budget.try_take(self.allowance):
            self._holding.add(handler)
            return
        assert isinstance(transport, asyncio.ReadTransport)
        transport.pause_reading()  # before its first read: nothing of it is buffered here
        self._waiting[handler] = asyncio.ensure_future(self._admit_when_free(handler, transport))

    async def _admit_when_free(
        self, handler: asyncio.BaseProtocol, transport: asyncio.ReadTransport
    ) -> None:
        await self.budget.take(self.allowance)
        del self._waiting[handler]
        self._holding.add(handler)
        transport.resume_reading()

    def _closed(self, handler: asyncio.BaseProtocol) -> None:
        self._leave(handler)
        if (source := self._sources.pop(handler, None)) is not None:
            self._open_from[source] -= 1
            if not self._open_from[source]:
                del self._open_from[source]

    def _leave(self, handler: asyncio.BaseProtocol | None) -> None:
        if handler in self._holding:
            self._holding.discard(handler)
            self.budget.give(self.allowance)
        elif (waiter := self._waiting.pop(handler, None)) is not None:  # type: ignore[arg-type]
            waiter.cancel()  # `ByteBudget.take` gives back an allowance granted meanwhile


class _GatedConnection(asyncio.Protocol):
    """An aiohttp request handler (`inner`) whose connection passes `gate`."""

    __slots__ = ("_gate", "_inner")

    def __init__(self, inner: asyncio.BaseProtocol, gate: ConnectionGate) -> None:
        assert isinstance(inner, asyncio.Protocol)
        self._inner = inner
        self._gate = gate

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)  # the transport's first read is still to come
        self._gate._opened(self._inner, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._gate._closed(self._inner)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


@dataclass(frozen=True)
class _Shared:
    bodies: ByteBudget
    spooled: ByteBudget
    gate: ConnectionGate


_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Shared] = weakref.WeakKeyDictionary()


def _shared() -> _Shared:
    loop = asyncio.get_running_loop()
    if (shared := _SHARED.get(loop)) is None:
        shared = _Shared(
            ByteBudget(UNAUTHENTICATED_BUDGET - CONNECTIONS_SHARE),
            ByteBudget(SPOOLED_BUDGET),
            ConnectionGate(ByteBudget(CONNECTIONS_SHARE)),
        )
        _SHARED[loop] = shared
    return shared


def shared_budgets() -> tuple[ByteBudget, ByteBudget]:
    """The budgets all listeners on the running event loop (one per process) share for bodies
    read before their caller is admitted: memory (`UNAUTHENTICATED_BUDGET` but the
    `CONNECTIONS_SHARE`) and temporary files (`SPOOLED_BUDGET`)."""
    shared = _shared()
    return shared.bodies, shared.spooled


def shared_gate() -> ConnectionGate:
    """The `ConnectionGate` all listeners on the running event loop are served through (its
    budget the `CONNECTIONS_SHARE`)."""
    return _shared().gate


@dataclass(frozen=True)
class Body:
    """What `BodyReader.read` made of a request: its bytes and the credential that admitted
    them, or the refusal to answer."""

    raw: bytes = b""
    secret: bytes | None = None
    """The secret (bearer header, else body entry) the listener accepted; None when the call
    was admitted before its body was read (its path)."""
    refusal: web.Response | None = None
    """401 (no accepted credential), 408 (too slow before authenticating), 413 (too large),
    503 (`SPOOLED_BUDGET` spent)."""
    route: str | None = None
    """The route id the call names (`ROUTE_HEADER`, else the first body entry read), also on a
    refusal (where it proves nothing: the proxy charges a refusal to no route)."""


class _Scan:
    """Finds secret and route entries in a body fed piece by piece, without parsing it."""

    def __init__(self) -> None:
        self._tail = b""
        self.secrets: list[bytes] = []
        self.route: str | None = None

    def feed(self, piece: bytes) -> list[bytes]:
        """The secret entries ending in `piece` (up to `_SECRETS_LOOKED_AT` in all)."""
        window = self._tail + piece
        seen = len(self._tail)  # entries ending in the tail were found with the previous piece
        found = []
        for match in _SECRET_IN_BODY.finditer(window):
            if match.end() > seen and len(self.secrets) < _SECRETS_LOOKED_AT:
                self.secrets.append(match.group(1))
                found.append(match.group(1))
        if self.route is None:
            for match in _ROUTE_IN_BODY.finditer(window):
                if match.end() > seen:
                    self.route = match.group(1).decode()
                    break
        self._tail = window[-_ENTRY_MAX:]
        return found

    @property
    def exhausted(self) -> bool:
        return len(self.secrets) >= _SECRETS_LOOKED_AT


class BodyReader:
    """Reads the request bodies of one listener, admitting only callers with a credential, in
    bounded memory: callers not yet authenticated hold at most `budget.limit` bytes together
    (default `shared_budgets()`), admitted ones up to `max_bytes` per body; an admitted call's
    connection leaves `gate` (default `shared_gate()`). The credential is looked for cheapest
    first: the path (checked by the caller, `accepts=None`), the bearer header, then the body's
    secret entries, found without parsing (our secrets are URL-safe tokens). A body past
    `KEPT_IN_MEMORY` goes on to an unlinked temporary file (at most `spooled.limit` bytes, 503
    beyond); a reader that must wait for the budget moves what it holds there first."""

    def __init__(
        self,
        max_bytes: int = MAX_BODY_BYTES,
        budget: ByteBudget | None = None,
        spooled: ByteBudget | None = None,
        gate: ConnectionGate | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self._budget = budget
        self._spooled = spooled
        self._gate = gate

    @property
    def budget(self) -> ByteBudget:
        """The memory budget given, else the one all listeners of the running event loop share
        (`shared_budgets`)."""
        return self._budget or shared_budgets()[0]

    @property
    def spooled(self) -> ByteBudget:
        """The budget of temporary files given, else the shared one (`shared_budgets`)."""
        return self._spooled or shared_budgets()[1]

    @property
    def gate(self) -> ConnectionGate:
        """The connection gate given, else the one all listeners of the running event loop are
        served through (`shared_gate`)."""
        return self._gate or shared_gate()

    async def read(
        self,
        request: web.Request,
        accepts: Callable[[bytes], bool] | None,
        *,
        in_body: bool = True,
        unauthorized: str = "missing or unknown credential",
    ) -> Body:
        """The body of `request` if `accepts` one of its secrets (`accepts=None`: the caller
        authenticated it already, e.g. by its path), else `Body.refusal`. `in_body=False`: the
        listener's credential is the bearer header only, so nothing is read without it."""
        route = request.headers.get(ROUTE_HEADER)
        if (request.content_length or 0) > self.max_bytes:
            return Body(refusal=self._too_large(), route=route)
        if accepts is None:
            return await self._rest(request, b"", None, route)
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            bearer = auth[7:].encode("utf-8", "surrogateescape")
            if accepts(bearer):
                return await self._rest(request, b"", bearer, route)
        if not in_body:
            return Body(refusal=json_error(401, unauthorized, "unauthorized"), route=route)
        return await self._scan(request, accepts, unauthorized, route)

    async def _scan(
        self,
        request: web.Request,
        accepts: Callable[[bytes], bool],
        unauthorized: str,
        route: str | None,
    ) -> Body:
        scan, budget = _Scan(), self.budget
        with tempfile.SpooledTemporaryFile(KEPT_IN_MEMORY) as spool:
            held = _Unadmitted(budget, self.spooled, spool)
            try:
                while True:
                    if not budget.try_take(READ_CHUNK):
                        held.spill()  # never wait holding budget: others may wait on ours
                        async with asyncio.timeout(UNAUTHENTICATED_READ_TIMEOUT):
                            await budget.take(READ_CHUNK)
                    async with held.reading(READ_CHUNK):
                        async with asyncio.timeout(UNAUTHENTICATED_READ_TIMEOUT):
                            piece = await request.content.read(READ_CHUNK)
                        held.add(piece)
                    if held.size > self.max_bytes:
                        return Body(refusal=self._too_large(), route=route or scan.route)
                    found = scan.feed(piece) if piece else []
                    secret = next(filter(accepts, found), None)
                    if secret is not None:
                        # Admitted: what was read is now the authenticated caller's.
                        raw = await held.release()
                        return await self._rest(request, raw, secret, route or scan.route)
                    if not piece or scan.exhausted:
                        refusal = json_error(401, unauthorized, "unauthorized")
                        return Body(refusal=refusal, route=route or scan.route)
            except TimeoutError:
                message = f"no credential within {UNAUTHENTICATED_READ_TIMEOUT:g} s per read"
                return Body(refusal=json_error(408, message, "request_timeout"), route=route)
            except _SpoolFull:
                message = "too many bytes of calls without a known credential in flight"
                refusal = json_error(503, message, "overloaded")
                refusal.headers["Retry-After"] = "1"
                return Body(refusal=refusal, route=route)
            finally:
                held.close()

    async def _rest(
        self, request: web.Request, read: bytes, secret: bytes | None, route: str | None
    ) -> Body:
        """`read` and the rest of the body of an admitted call, up to `max_bytes`."""
        self.gate.admitted(request)
        pieces, size = [read], len(read)
        while piece := await request.content.readany():
            pieces.append(piece)
            size += len(piece)
            if size > self.max_bytes:
                return Body(refusal=self._too_large(), secret=secret, route=route)
        return Body(raw=b"".join(pieces), secret=secret, route=route)

    def _too_large(self) -> web.Response:
        return json_error(413, f"body exceeds {self.max_bytes} bytes", "request_too_large")


class _SpoolFull(Exception):
    """The process's `SPOOLED_BUDGET` has no room for more of this body."""


class _Unadmitted:
    """The bytes of a body read before its caller is admitted, in `spool`: in memory, taken
    from `budget`, up to `KEPT_IN_MEMORY`; beyond, or once `spill()`ed, in its file, taken from
    `disk` (`_SpoolFull` when it has no room)."""

    def __init__(
        self, budget: ByteBudget, disk: ByteBudget, spool: tempfile.SpooledTemporaryFile[bytes]
    ) -> None:
        self._budget = budget
        self._disk = disk
        self._spool = spool
        self._on_disk = False
        self._taken = 0
        """Budget this body holds: its bytes in memory and the read under way."""
        self.size = 0

    @property
    def _in_memory(self) -> int:
        return 0 if self._on_disk else self.size

    @contextlib.asynccontextmanager
    async def reading(self, n: int) -> AsyncIterator[None]:
        """Around a read of at most `n` bytes whose budget the caller has just taken."""
        self._taken += n
        try:
            yield
        finally:
            self._settle()

    def add(self, piece: bytes) -> None:
        if self.size + len(piece) > KEPT_IN_MEMORY:
            self.spill()
        if self._on_disk and not self._disk.try_take(len(piece)):
            raise _SpoolFull
        self._spool.write(piece)
        self.size += len(piece)

    def spill(self) -> None:
        """Move the bytes in memory to the file (and their budget back)."""
        if self.size and not self._on_disk:
            if not self._disk.try_take(self.size):
                raise _SpoolFull
            self._spool.rollover()
            self._on_disk = True
            self._settle()

    async def release(self) -> bytes:
        """All the bytes, off the budget (the caller is admitted)."""
        if self._on_disk:  # up to `max_bytes` from a file: not on the event loop
            raw = await asyncio.to_thread(_read_back, self._spool)
        else:
            raw = _read_back(self._spool)
        self.close()
        return raw

    def _settle(self) -> None:
        """Give back the budget beyond the bytes now in memory."""
        self._budget.give(self._taken - self._in_memory)
        self._taken = self._in_memory

    def close(self) -> None:
        """Forget the bytes and give back all budget (the spool's owner closes it)."""
        if self._on_disk:
            self._disk.give(self.size)
        self._spool.truncate(0)
        self.size = 0
        self._on_disk = False
        self._settle()


def _read_back(file: IO[bytes] | tempfile.SpooledTemporaryFile[bytes]) -> bytes:
    file.seek(0)
    return file.read()


def json_error(status: int, message: str, kind: str) -> web.Response:
    """An OpenAI-style error body (`{"error": {"message", "type"}}`) with `status`."""
    return web.json_response({"error": {"message": message, "type": kind}}, status=status)


def error_message(payload: Any) -> str:
    """The message of a parsed OpenAI-style error body (`{"error": {"message": ...}}`, or
    `{"error": "..."}`); "" if it has none."""
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict):
            return str(error.get("message", ""))
        if error is not None:
            return str(error)
    return ""


def retry_after(headers: Any) -> float | None:
    """Seconds the answer asks to wait (`retry-after-ms`, or `Retry-After` in seconds or as an
    HTTP date), as the OpenAI SDK reads them; None if absent or unreadable."""
    with contextlib.suppress(TypeError, ValueError):
        seconds = float(headers.get("retry-after-ms")) / 1000
        return seconds if math.isfinite(seconds) else None
    value = headers.get("retry-after")
    with contextlib.suppress(TypeError, ValueError):
        seconds = float(value)
        return seconds if math.isfinite(seconds) else None
    try:
        date = email.utils.parsedate_tz(value)
        return None if date is None else float(email.utils.mktime_tz(date) - time.time())
    except (TypeError, ValueError, OverflowError, OSError):
        return None
