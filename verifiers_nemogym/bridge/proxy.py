"""NeMoGymModelProxy: the `policy_model` NeMo Gym sees, routing every call to its rollout.

A call is authenticated (path credential, or secret and route id, `bridge.wire`) before its body
is parsed, forwarded in any dialect to its route's upstream with the route's bearer secret, and
always answered with an HTTP status (NeMo Gym's client retries dropped connections forever).
Transient failures are retried here as `ProxyLimits.retry` says, in place of the SDK retries
NeMo Gym's agent lacks; a `Route` keeps the first provider error and the rollout's stop
condition. The proxy knows no NeMo Gym or verifiers internals beyond the two wire disagreements
it bridges (`_reply_ok`, `_reply_error`). Contract: docs/architecture.md, "The model proxy";
retries and stops: docs/reliability.md; train routes: docs/training.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pydantic_core
from aiohttp import web

from verifiers_nemogym.bridge import anthropic, chat, redact, wire
from verifiers_nemogym.bridge.responses import (
    complete_response,
    incomplete_response,
    response_events,
)
from verifiers_nemogym.bridge.wire import (
    MAX_BODY_BYTES,
    ROLLOUT_ID_PATTERN,
    ROUTE_HEADER,
    ROUTE_KEY,
    SECRET_KEY,
    json_error,
)
from verifiers_nemogym.net import AppServer
from verifiers_nemogym.retry import RetryPolicy

logger = logging.getLogger(__name__)

WRONG_SECRET = "missing or wrong proxy secret"


@dataclass(frozen=True)
class ProxyLimits:
    """Explicit bounds; every one is a failure mode seen in earlier integrations."""

    max_body_bytes: int = MAX_BODY_BYTES
    """Largest request body accepted (413 above it). NeMo Gym resends the whole conversation."""
    pool_size: int = 1024
    """Upstream connections open at most, across all routes; a call beyond waits for one
    (within its `call_timeout`), it does not fail."""
    connect_timeout: float = 10.0
    """Seconds to open a connection to an upstream endpoint (not counting the wait for a
    free connection of the pool)."""
    call_timeout: float = 3600.0
    """Seconds one model call may take upstream before the proxy answers 504."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """How a call that failed transiently is retried (`retry.RetryPolicy`: the OpenAI SDK's
    curve; a `Retry-After` beyond its `max_retry_after` is not waited for: the error stands)."""


@dataclass(frozen=True)
class ProviderFailure:
    """A model call the route's endpoint answered with an error that was not verifiers
    refusing a call of a stopped rollout (the provider's own error, relayed by verifiers'
    interception, or the endpoint being unreachable). `message` is already redacted."""

    status: int
    message: str
    attempts: int = 1
    """How many times the call was sent (more than 1: it was retried, see module doc)."""

    def __str__(self) -> str:
        tries = f" (after {self.attempts} attempts)" if self.attempts > 1 else ""
        return f"provider answered {self.status}{tries}: {self.message}"


class Route:
    """One rollout's route through the proxy: where its calls go, and what became of them.

    `tag(row)` marks a row's calls as this route's. `failure` is the first provider error any
    of its calls got (`failed` is set with it): the rollout is then an error, whatever the agent
    does next. `stop_condition`, if given, returns verifiers' stop condition for the rollout (or
    None while it runs); it is consulted only when the endpoint answered an error. `train`: carry
    Responses calls as Chat Completions (see module doc).
    """

    def __init__(
        self,
        route_id: str,
        endpoint: str,
        bearer: str,
        session: aiohttp.ClientSession,
        proxy_secret: str,
        stop_condition: Callable[[], str | None] | None,
        train: bool = False,
    ) -> None:
        self.id = route_id
        self.endpoint = endpoint
        self.bearer = bearer
        self.session = session
        self.proxy_secret = proxy_secret
        self.stop_condition = stop_condition
        self.train = train
        self.calls = 0
        """Model calls this route forwarded (any outcome)."""
        self.retries = 0
        """Extra attempts its calls took after transient failures (not counted in `calls`)."""
        self.failure: ProviderFailure | None = None
        self.failed = asyncio.Event()
        """Set when `failure` is."""
        self.inflight: set[asyncio.Future[tuple[int, bytes]]] = set()
        """Its calls now upstream (cancelled when the route closes)."""
        self.call_times: list[tuple[float, float]] = []
        """(arrived, answered) wall-clock seconds of each call (`phases`)."""

    @property
    def rollout_id(self) -> str:
        """NeMo Gym's rollout id for this route: what its `/ng-rollout/<id>/` calls carry, which
        routes and authenticates them (`wire.rollout_id`)."""
        return wire.rollout_id(self.id, self.proxy_secret)

    def tag(self, row: dict[str, Any]) -> dict[str, Any]:
        """A copy of `row` whose model calls come to this route (`wire.tag_row`)."""
        return wire.tag_row(row, self.id, self.proxy_secret)

    def stopped(self) -> str | None:
        """verifiers' stop condition for this rollout, if it stopped (None without a source)."""
        return self.stop_condition() if self.stop_condition is not None else None

    def fail(self, failure: ProviderFailure) -> None:
        """Record `failure` unless an earlier one is recorded: the first cause is the real one."""
        if self.failure is None:
            self.failure = failure
            self.failed.set()


class NeMoGymModelProxy(AppServer):
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
        self._secret_bytes = self.secret.encode()
        self._digest = wire.secret_digest(self.secret)
        self.limits = limits or ProxyLimits()
        self.calls = 0
        """Model calls forwarded upstream since start (any outcome)."""
        self.rollout_path_calls = 0
        """Of those, calls that arrived as `/ng-rollout/<id>/v1/...`."""
        self._routes: dict[str, Route] = {}
        # Route ids are `<this proxy's prefix>-<n>` for the n-th route opened, so "finished" is
        # "ours, opened, no longer open": known for every route ever closed, in no memory.
        self._id_prefix = secrets.token_hex(8)
        self._opened = 0
        self._protected = False
        self._connector: aiohttp.TCPConnector | None = None
        self._bodies = wire.BodyReader(self.limits.max_body_bytes)
        """Reads call bodies in bounded memory until their secret is known (`wire.BodyReader`)."""

    def _gate(self) -> wire.ConnectionGate:
        return self._bodies.gate

    def _app(self) -> web.Application:
        return wire.model_call_app(self._forward, max_body_bytes=self.limits.max_body_bytes)

    async def start(self) -> None:
        """Bind and serve; `port` is the bound port afterwards (0 picks a free one)."""
        self._connector = aiohttp.TCPConnector(limit=self.limits.pool_size)
        await super().start()
        if not self._protected:
            self._protected = True
            redact.protect(self.secret)
        logger.info("model proxy listening on %s", self.url)

    async def stop(self) -> None:
        """Close every route and the server. Idempotent."""
        for route_id in list(self._routes):
            await self.close_route(route_id)
        await super().stop()
        if self._connector is not None:
            connector, self._connector = self._connector, None
            await connector.close()
        if self._protected:
            self._protected = False
            redact.forget(self.secret)

    # --- routes ---------------------------------------------------------------------------

    def open_route(
        self,
        endpoint: str,
        secret: str,
        *,
        stop_condition: Callable[[], str | None] | None = None,
        train: bool = False,
    ) -> Route:
        """Route calls tagged with the returned route's id to `endpoint` (a base URL ending in
        `/v1`) with `Authorization: Bearer <secret>`. Each route keeps its own cookies.
        `stop_condition`: see `Route`; without it every error answer is a provider failure.
        `train`: Responses calls go to the endpoint as Chat Completions (see module doc)."""
        if self._connector is None:
            raise RuntimeError("NeMoGymModelProxy.open_route() before start()")
        # Hex and a dash: a route id is also NeMo Gym's rollout id, a path segment
        # (ROLLOUT_ID_PATTERN). Guessable on purpose: every call proves itself with the secret.
        route_id = f"{self._id_prefix}-{self._opened:x}"
        self._opened += 1
        session = aiohttp.ClientSession(
            connector=self._connector,
            connector_owner=False,
            # unsafe: endpoints are IP addresses (loopback), whose cookies aiohttp drops otherwise.
            cookie_jar=aiohttp.CookieJar(unsafe=True),
            # sock_connect, not connect: aiohttp's `connect` also bounds the wait for a free
            # pool slot, which would fail call 1,025 of a busy process after 10 s.
            timeout=aiohttp.ClientTimeout(
                total=self.limits.call_timeout, sock_connect=self.limits.connect_timeout
            ),
        )
        route = Route(
            route_id, endpoint.rstrip("/"), secret, session, self.secret, stop_condition, train
        )
        self._routes[route_id] = route
        redact.protect(secret)
        return route

    async def close_route(self, route: Route | str) -> int:
        """Stop routing `route` (late calls get 410); returns how many calls it carried."""
        route_id = route.id if isinstance(route, Route) else route
        closing = self._routes.pop(route_id, None)
        if closing is None:
            return 0
        redact.forget(closing.bearer)
        # Its calls still upstream (a rollout that hit its deadline on a hung model) would hold
        # a pooled connection until `call_timeout`: cancel them; their agents get 410.
        for call in list(closing.inflight):
            call.cancel()
        await closing.session.close()
        return closing.calls

    @contextlib.asynccontextmanager
    async def route(
        self,
        endpoint: str,
        secret: str,
        *,
        stop_condition: Callable[[], str | None] | None = None,
        train: bool = False,
    ) -> AsyncIterator[Route]:
        """A route open for the duration of the block (closed even on cancellation)."""
        route = self.open_route(endpoint, secret, stop_condition=stop_condition, train=train)
        try:
            yield route
        finally:
            await asyncio.shield(self.close_route(route))

    @property
    def open_routes(self) -> int:
        return len(self._routes)

    # --- handlers -------------------------------------------------------------------------

    def _is_secret(self, claimed: bytes) -> bool:
        return hmac.compare_digest(claimed, self._secret_bytes)

    def _rollout_route(self, path_id: str) -> Route | web.Response:
        """The open route a `/ng-rollout/<id>/` path names with a valid credential, or the
        refusal, decided before the body is read (`wire.rollout_id`)."""
        if not ROLLOUT_ID_PATTERN.match(path_id):
            return json_error(404, "malformed rollout id in path", "unknown_route")
        route_id = wire.rollout_route(path_id, self._digest)
        if route_id is None:
            # Not charged to any route: whoever forges a call must not be able to fail one.
            return json_error(401, "missing or wrong rollout credential", "unauthorized")
        return self._open_route(route_id)

    def _open_route(self, route_id: Any) -> Route | web.Response:
        """The open route `route_id`, or 410 (it finished) / 404 (never opened, not a str)."""
        if not isinstance(route_id, str):  # absent, or not a string (a list is unhashable)
            return json_error(404, f"unknown route {route_id!r}", "unknown_route")
        if (route := self._routes.get(route_id)) is not None:
            return route
        if self._was_opened(route_id):
            return json_error(410, f"route {route_id!r} has finished", "route_finished")
        return json_error(404, f"unknown route {route_id!r}", "unknown_route")

    def _was_opened(self, route_id: str) -> bool:
        """Whether this proxy ever opened `route_id` (see `_id_prefix`)."""
        prefix, dash, number = route_id.partition("-")
        try:
            n = int(number, 16)
        except ValueError:
            return False
        # The canonical spelling only: int() also takes "0x1f", "1_f", " 1f".
        return prefix == self._id_prefix and bool(dash) and f"{n:x}" == number and n < self._opened

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        path_id = request.match_info.get("rollout_id")
        by_path = self._rollout_route(path_id) if path_id is not None else None
        if isinstance(by_path, web.Response):
            return by_path
        # Authenticated before parsing: an unauthenticated body is never parsed, and is read
        # within the unauthenticated budget until its secret is found (`wire.BodyReader`).
        accepts = None if by_path is not None else self._is_secret
        read = await self._bodies.read(request, accepts, unauthorized=WRONG_SECRET)
        if read.refusal is not None:
            # Charged to no route, whatever route it names: its caller proved none (neither the
            # secret nor a path credential), so it may be anyone who reaches this listener (a
            # container through the door), and a refusal it earns must not fail a neighbour.
            return read.refusal
        raw = read.raw
        try:
            # Large bodies (long multi-turn prompts) are parsed off the event loop, which
            # serves every other rollout of this process meanwhile.
            body = await _parse(raw)
        except ValueError as e:
            return json_error(400, f"body is not JSON: {e}", "invalid_request_error")
        if not isinstance(body, dict):
            return json_error(400, "body must be a JSON object", "invalid_request_error")
        named_id = _drop_routing_keys(body) or request.headers.get(ROUTE_HEADER)
        route = by_path or self._open_route(named_id)
        if isinstance(route, web.Response):
            return route
        return await self._count(route, request, body)

    async def _count(
        self, route: Route, request: web.Request, body: dict[str, Any]
    ) -> web.Response:
        route.calls += 1
        self.calls += 1
        self.rollout_path_calls += "rollout_id" in request.match_info
        arrived = time.time()
        try:
            return await self._call(route, request.match_info["tail"], body)
        finally:
            route.call_times.append((arrived, time.time()))

    async def _call(self, route: Route, tail: str, body: dict[str, Any]) -> web.Response:
        if route.train and tail in _CARRIED:
            return await self._train_call(route, body, _CARRIED[tail])
        if route.train and tail != "chat/completions":
            # verifiers' train client renders Chat Completions only; anything else would be a
            # turn without token ids, a silent hole in the training sample.
            message = (
                f"train mode records token ids of Chat Completions, Responses and Anthropic "
                f"Messages calls; this rollout's agent called /v1/{tail}"
            )
            route.fail(ProviderFailure(400, message))
            return json_error(400, message, "invalid_request_error")
        status, raw, failure, attempts = await self._post(route, tail, body)
        if failure is not None:
            return failure
        if status == 200 and body.get("stream") is True:
            # Served whole by verifiers once the turn is committed: relayed as it came.
            return web.Response(body=raw, content_type="text/event-stream")
        if status == 200:
            return _reply_ok(route, raw, body, attempts, is_responses=tail == "responses")
        return _reply_error(route, status, raw, body, attempts, tail=tail)

    async def _post(
        self, route: Route, tail: str, body: dict[str, Any]
    ) -> tuple[int, bytes, web.Response | None, int]:
        """POST `body` to the route's `endpoint/tail`, retried while transient (module doc): the
        last attempt's status and body, or (when it could not be reached or timed out) the error
        reply for the agent, the route failed with it; and how many attempts it took."""
        url = f"{route.endpoint}/{tail}"
        # Serialized once: every attempt sends the same bytes, which is what lets verifiers'
        # interception recognise a retry of a turn it already committed (its body digest).
        data = pydantic_core.to_json(body)
        # One future for all attempts and the waits between them: closing the route (the
        # rollout's deadline) cancels a backoff as it cancels a call upstream.
        attempts = [0]  # filled in by `_attempts`, whatever way it ends
        call = asyncio.ensure_future(self._attempts(route, url, data, attempts))
        route.inflight.add(call)
        call.add_done_callback(route.inflight.discard)
        try:
            status, raw = await call
            return status, raw, None, attempts[0]
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this handler itself is being cancelled (the proxy stops)
            # close_route cancelled the call: the rollout is over, nobody waits for it.
            gone = json_error(410, f"route {route.id!r} has finished", "route_finished")
            return 0, b"", gone, attempts[0]
        except TimeoutError:
            message = f"model endpoint {url} did not answer within {self.limits.call_timeout:g} s"
            route.fail(ProviderFailure(504, message, attempts[0]))
            return 0, b"", json_error(504, message, "upstream_timeout"), attempts[0]
        except (aiohttp.ClientError, RuntimeError) as e:
            # RuntimeError: the route's session was closed under an in-flight call.
            message = redact.cut(f"model endpoint {url} failed: {e!r}", 2000)
            route.fail(ProviderFailure(502, message, attempts[0]))
            return 0, b"", json_error(502, message, "upstream_error"), attempts[0]

    async def _attempts(
        self, route: Route, url: str, data: bytes, attempts: list[int]
    ) -> tuple[int, bytes]:
        """Send `data` until an answer that is not transient, or `max_retries` retries; the last
        answer (status, body), or the last attempt's exception. `attempts[0]` counts the sends."""
        headers = {
            # Built from scratch on purpose: nothing the agent sent (cookies, auth, hop headers)
            # reaches the endpoint except the body; the route supplies the credentials.
            "Authorization": f"Bearer {route.bearer}",
            "Content-Type": "application/json",
        }
        policy = self.limits.retry
        for attempt in range(policy.retries + 1):
            attempts[0] = attempt + 1
            if attempt:
                headers[RETRY_COUNT_HEADER] = str(attempt)
            # No retry once verifiers stopped the rollout (it would refuse the retry): then
            # the outcome stands as it is; likewise after the last attempt.
            try:
                status, raw, answer_headers = await _send(route.session, url, data, headers)
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
                # A connection refused, reset or closed mid-answer. Not the call timeout (a
                # plain TimeoutError): an hour-long call is not tried again.
                delay = policy.delay(attempt)
                if delay is None or route.stopped() is not None:
                    raise
                why = type(e).__name__
            else:
                if not _transient(policy, status) or route.stopped() is not None:
                    return status, raw
                delay = policy.delay(attempt, wire.retry_after(answer_headers))
                if delay is None:
                    return status, raw  # the last attempt, or asked to wait longer than we would
                why = f"answer {status}"
            route.retries += 1
            logger.warning(
                "model call of route %s: %s; retry %d/%d in %.2f s",
                route.id,
                why,
                attempt + 1,
                policy.retries,
                delay,
            )
            await asyncio.sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _train_call(
        self, route: Route, request: dict[str, Any], dialect: _Carried
    ) -> web.Response:
        """One call of a train route in another dialect, carried as Chat Completions (a
        streamed one is answered whole, as the events of the converted reply)."""
        streamed = request.get("stream") is True
        if streamed:
            request = {k: v for k, v in request.items() if k not in ("stream", "stream_options")}
        try:
            chat_body = dialect.to_chat(request)
        except chat.ChatConversionError as e:
            # Nothing verifiers could record: the agent's request itself has no chat form.
            message = f"train mode cannot carry this {dialect.name} request: {e}"
            route.fail(ProviderFailure(400, message))
            return json_error(400, message, "invalid_request_error")
        status, raw, failure, attempts = await self._post(route, "chat/completions", chat_body)
        if failure is not None:
            return failure
        if status != 200:
            try:
                payload = pydantic_core.from_json(raw)
            except ValueError:
                payload = raw[:2000].decode(errors="replace")
            # verifiers' stop first, as in eval mode; then the one error NeMo Gym's own
            # training server turns into an answer: a prompt over the model's context.
            if route.stopped() is None and chat.is_overlong_prompt(status, payload):
                return dialect.reply(dialect.from_chat(chat.OVERLONG_REPLY, request), streamed)
            return _reply_error(route, status, raw, request, attempts, tail=dialect.tail)
        try:
            reply = pydantic_core.from_json(raw)
            return dialect.reply(dialect.from_chat(reply, request), streamed)
        except (ValueError, chat.ChatConversionError) as e:
            message = redact.cut(f"model endpoint answered 200 with no chat completion: {e}", 2000)
            route.fail(ProviderFailure(502, message, attempts))
            return json_error(502, message, "upstream_error")


@dataclass(frozen=True)
class _Carried:
    """A dialect a train route carries as Chat Completions: its converters both ways, and the
    events a streaming client of the dialect reads."""

    name: str
    tail: str
    to_chat: Callable[[dict[str, Any]], dict[str, Any]]
    from_chat: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]
    events: Callable[[dict[str, Any]], bytes]

    def reply(self, obj: dict[str, Any], streamed: bool) -> web.Response:
        if streamed:
            return web.Response(body=self.events(obj), content_type="text/event-stream")
        return _json(obj)


_CARRIED = {
    "responses": _Carried(
        "Responses", "responses", chat.responses_to_chat, chat.chat_to_responses, response_events
    ),
    "messages": _Carried(
        "Anthropic Messages",
        "messages",
        anthropic.messages_to_chat,
        anthropic.chat_to_message,
        anthropic.message_events,
    ),
}
"""Dialects of NeMo Gym's agents and CLIs a train route carries as Chat Completions."""


def _drop_routing_keys(body: dict[str, Any]) -> Any:
    """Remove our routing entries from `body`'s metadata (they never go upstream; metadata
    that held only them goes too); the route id it named, if any."""
    metadata = body.get("metadata")
    if not isinstance(metadata, dict):
        return None
    metadata.pop(SECRET_KEY, None)
    route_id = metadata.pop(ROUTE_KEY, None)
    if not metadata:
        del body["metadata"]
    return route_id


RETRY_COUNT_HEADER = "x-stainless-retry-count"
"""The OpenAI SDK's attempt counter (1 on the first retry), which verifiers' interception reads
to replay, rather than commit again, a turn it already committed."""


def _transient(policy: RetryPolicy, status: int) -> bool:
    """Worth another attempt: what the policy retries (the OpenAI SDK's 408, 429, 5xx), never
    409. verifiers' interception answers 409 for a rollout that has concluded, which no retry
    changes."""
    return status != 409 and policy.is_transient(status)


async def _send(
    session: aiohttp.ClientSession, url: str, data: bytes, headers: dict[str, str]
) -> tuple[int, bytes, Any]:
    async with session.post(url, data=data, headers=headers) as upstream:
        return upstream.status, await upstream.read(), upstream.headers


_PARSE_IN_THREAD_BYTES = 1024 * 1024


async def _parse(raw: bytes) -> Any:
    """The JSON `raw`, parsed in a worker thread above 1 MiB (a 25 MB body takes ~0.8 s)."""
    if len(raw) > _PARSE_IN_THREAD_BYTES:
        return await asyncio.to_thread(pydantic_core.from_json, raw)
    return pydantic_core.from_json(raw)


def _reply_ok(
    route: Route, raw: bytes, request: dict[str, Any], attempts: int, *, is_responses: bool
) -> web.Response:
    """The endpoint's answer, completed to what NeMo Gym's agents accept."""
    try:
        payload = pydantic_core.from_json(raw)
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        message = "model endpoint answered 200 with a body that is not a JSON object"
        route.fail(ProviderFailure(502, message, attempts))
        return json_error(502, message, "upstream_error")
    if is_responses:
        payload = complete_response(payload, request)
    return _json(payload)


def _reply_error(
    route: Route,
    status: int,
    raw: bytes,
    request: dict[str, Any],
    attempts: int,
    *,
    tail: str = "responses",
) -> web.Response:
    """An error answer of the endpoint: verifiers refusing a call of a stopped rollout becomes an
    `incomplete` reply to a Responses call (relayed as it is in other dialects: the agent's CLI
    ends, and NeMo Gym verifies what it did); anything else is a provider failure of the route,
    relayed with its status."""
    try:
        payload = pydantic_core.from_json(raw)
    except ValueError:
        payload = None
    message = redact.cut(
        wire.error_message(payload) or raw[: 2000 + 256].decode(errors="replace"), 2000
    )
    # Decided by verifiers' own state, never by the status or text alone: verifiers sets the
    # trace's stop condition before it refuses a call (turn limit, @vf.stop), while a provider's
    # 400/401/409 relayed by its interception leaves the rollout running.
    stopped = route.stopped()
    if stopped is not None and tail == "responses" and request.get("stream") is not True:
        # NeMo Gym's agent would raise and never verify; an `incomplete` reply makes it end its
        # loop and verify what was done, so the reward is kept.
        return _json(incomplete_response(request, message or f"rollout stopped: {stopped}"))
    if stopped is not None:
        return (
            _json(payload, status)
            if isinstance(payload, dict)
            else json_error(status, message or f"rollout stopped: {stopped}", "rollout_stopped")
        )
    route.fail(ProviderFailure(status, message[:2000], attempts))
    if isinstance(payload, dict):
        return _json(payload, status)
    return json_error(status, f"upstream answered {status}: {message}", "upstream_error")


def _json(obj: Any, status: int = 200) -> web.Response:
    # Bytes straight from pydantic_core: json_response would decode them to str and back.
    return web.Response(
        body=pydantic_core.to_json(obj), status=status, content_type="application/json"
    )
