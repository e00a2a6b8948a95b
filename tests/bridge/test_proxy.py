"""NeMoGymModelProxy against a real aiohttp upstream on loopback: auth, routing, limits."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pydantic_core
import pytest
from aiohttp import web
from helpers.processes import until
from openai.types.responses import Response

from verifiers_nemogym.bridge import redact
from verifiers_nemogym.bridge.proxy import (
    NeMoGymModelProxy,
    ProviderFailure,
    ProxyLimits,
    Route,
)
from verifiers_nemogym.bridge.wire import (
    ROLLOUT_ID_KEY,
    ROLLOUT_ID_PATTERN,
    ROUTE_HEADER,
    ROUTE_KEY,
    SECRET_KEY,
    rollout_id,
    route_metadata,
    tag_row,
)
from verifiers_nemogym.policies.scripted import ScriptedPolicy
from verifiers_nemogym.retry import RetryPolicy

# Marked by hand (its imports do not reach verifiers): the proxy speaks verifiers' interception
# protocol, stop texts included, so it also runs on the verifiers pre-release (run.sh).
pytestmark = pytest.mark.verifiers_dev


class Upstream:
    """Stands in for verifiers' interception endpoint: records who called, answers per script."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.answer: dict[str, Any] | None = None
        self.status = 200

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        secret = request.headers["Authorization"].removeprefix("Bearer ")
        self.seen.append(
            {
                "secret": secret,
                "body": body,
                "cookie": request.cookies.get("turn"),
                "path": request.path,
            }
        )
        if self.answer is not None:
            return web.json_response(self.answer, status=self.status)
        reply = web.json_response(
            {
                # Minimal: fields NeMo Gym requires but OpenAI leaves optional are missing.
                "output": [
                    {"type": "message", "content": [{"type": "output_text", "text": secret}]}
                ],
            }
        )
        reply.set_cookie("turn", str(int(request.cookies.get("turn", "0")) + 1))
        return reply


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[Upstream, str]]:
    up = Upstream()
    app = web.Application(client_max_size=1024**3)
    app.router.add_post("/v1/{tail:.*}", up.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield up, f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    await runner.cleanup()


@pytest.fixture
async def proxy() -> AsyncIterator[NeMoGymModelProxy]:
    # Short backoff: retries are exercised with the real curve in their own tests below.
    limits = ProxyLimits(max_body_bytes=8 * 1024 * 1024, retry=RetryPolicy(base=0.01))
    async with NeMoGymModelProxy(limits=limits) as p:
        yield p


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
        yield session


def body(proxy: NeMoGymModelProxy, route: Route | str | None, **extra: Any) -> dict[str, Any]:
    route_id = route.id if isinstance(route, Route) else route
    metadata = route_metadata(route_id, proxy.secret) if route_id else {}
    return {"input": [{"role": "user", "content": "hi"}], "metadata": metadata, **extra}


async def post(http: aiohttp.ClientSession, proxy: NeMoGymModelProxy, payload: Any, **kw: Any):
    async with http.post(f"{proxy.url}/v1/responses", json=payload, **kw) as r:
        return r.status, await r.json()


async def test_health_needs_no_secret(proxy, http):
    async with http.get(proxy.url) as r:
        assert r.status == 200


async def test_refuses_missing_or_wrong_secret(proxy, upstream, http):
    up, endpoint = upstream
    route = proxy.open_route(endpoint, "s1").id
    no_secret = {"input": "hi", "metadata": {ROUTE_KEY: route}}
    wrong = {"input": "hi", "metadata": {ROUTE_KEY: route, SECRET_KEY: "nope"}}
    for payload in (no_secret, wrong):
        status, reply = await post(http, proxy, payload)
        assert status == 401
        assert reply["error"]["type"] == "unauthorized"
    status, _ = await post(
        http,
        proxy,
        {"input": "hi"},
        headers={"Authorization": f"Bearer {proxy.secret}", ROUTE_HEADER: route},
    )
    assert status == 200
    assert len(up.seen) == 1  # the refused calls never went upstream


async def test_unknown_and_finished_routes_are_4xx_never_another_route(proxy, upstream, http):
    up, endpoint = upstream
    live = proxy.open_route(endpoint, "live-secret")
    status, reply = await post(http, proxy, body(proxy, "no-such-route"))
    assert (status, reply["error"]["type"]) == (404, "unknown_route")
    done = proxy.open_route(endpoint, "done-secret")
    await proxy.close_route(done)
    status, reply = await post(http, proxy, body(proxy, done))
    assert (status, reply["error"]["type"]) == (410, "route_finished")
    status, _ = await post(http, proxy, {"input": "hi", "metadata": {SECRET_KEY: proxy.secret}})
    assert status == 404
    assert up.seen == []  # nothing fell back to the one live route
    assert proxy.open_routes == 1 and live


async def test_finished_routes_cost_no_memory_and_all_stay_410(proxy, upstream, http):
    """A long run closes a route per rollout: what the proxy keeps of them must not grow with
    their number (the soak's env process did, ~170 B each), yet every one's late call is 410."""
    _, endpoint = upstream

    async def churn(n: int) -> Route:
        """Open and close `n` routes, 100 open at a time (as rollouts in flight); the first."""
        first = None
        for _ in range(n // 100):
            routes = [proxy.open_route(endpoint, "s") for _ in range(100)]
            for route in routes:
                await proxy.close_route(route)
            first = first or routes[0]
        assert first is not None
        return first

    first = await churn(1_000)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        await churn(20_000)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(d.size_diff for d in after.compare_to(before, "filename"))
    assert grown < 256 * 1024, f"closing 20,000 routes kept {grown} bytes"
    status, reply = await post(http, proxy, body(proxy, first))
    assert (status, reply["error"]["type"]) == (410, "route_finished")
    # Ids this proxy never opened are unknown, however they are spelled.
    prefix, _, number = first.id.partition("-")
    for never in (f"{prefix}-{21_000:x}", f"{prefix}-0x{number}", f"{prefix}-0{number}", prefix):
        status, reply = await post(http, proxy, body(proxy, never))
        assert (status, reply["error"]["type"]) == (404, "unknown_route"), never


async def test_many_concurrent_routes_each_get_only_their_calls(proxy, upstream, http):
    up, endpoint = upstream
    routes = {f"secret-{i}": proxy.open_route(endpoint, f"secret-{i}") for i in range(200)}

    async def rollout(secret: str, route: str) -> list[str]:
        texts = []
        for _ in range(3):
            status, reply = await post(http, proxy, body(proxy, route))
            assert status == 200
            texts.append(reply["output"][0]["content"][0]["text"])
        return texts

    results = await asyncio.gather(*(rollout(s, r) for s, r in routes.items()))
    for secret, texts in zip(routes, results, strict=True):
        assert texts == [secret] * 3  # upstream saw this route's own secret every time
    assert len(up.seen) == 600
    # Our routing keys never leave the proxy; each route keeps its own cookie sequence.
    assert all(ROUTE_KEY not in (c["body"].get("metadata") or {}) for c in up.seen)
    for secret in routes:
        cookies = [c["cookie"] for c in up.seen if c["secret"] == secret]
        assert cookies == [None, "1", "2"]


async def test_completes_replies_nemo_gym_would_reject(proxy, upstream, http):
    _, endpoint = upstream
    route = proxy.open_route(endpoint, "s")
    tools = [{"type": "function", "name": "f", "parameters": {}, "strict": True}]
    status, reply = await post(http, proxy, body(proxy, route, tools=tools, tool_choice="auto"))
    assert status == 200
    response = Response.model_validate(reply)  # the openai schema NeMo Gym's subclasses
    assert response.tools[0].name == "f"
    assert reply["output"][0]["id"] and reply["output"][0]["content"][0]["annotations"] == []
    assert isinstance(reply["created_at"], int) and reply["parallel_tool_calls"] is True


ERRORS = [
    (400, "rollout stopped: max_turns_reached"),
    (409, "rollout concluded"),
    (401, "unauthorized"),
    (429, "slow down"),
    (500, "overloaded"),
]


@pytest.mark.parametrize(("status", "message"), ERRORS)
async def test_error_of_a_stopped_rollout_becomes_incomplete_response(
    proxy, upstream, http, status, message
):
    up, endpoint = upstream
    up.answer, up.status = {"error": {"message": message, "type": "invalid_request_error"}}, status
    route = proxy.open_route(endpoint, "s", stop_condition=lambda: "max_turns_reached")
    got, reply = await post(http, proxy, body(proxy, route))
    assert got == 200
    assert reply["status"] == "incomplete" and reply["incomplete_details"]["reason"]
    assert reply["output"] == [] and reply["metadata"]["vf_stop"] == message
    Response.model_validate(reply)
    assert route.failure is None and not route.failed.is_set()


@pytest.mark.parametrize(("status", "message"), ERRORS)
@pytest.mark.parametrize("source", ["running", "none"])
async def test_error_of_a_running_rollout_is_a_provider_failure(
    proxy, upstream, http, status, message, source
):
    # The same statuses and texts, verifiers' stop texts included: while the rollout has no stop
    # condition (or the route has no way to ask), the answer is the provider's, never a stop.
    up, endpoint = upstream
    up.answer, up.status = {"error": {"message": message, "type": "server_error"}}, status
    stop_condition = (lambda: None) if source == "running" else None
    route = proxy.open_route(endpoint, "s", stop_condition=stop_condition)
    got, reply = await post(http, proxy, body(proxy, route))
    assert (got, reply["error"]["message"]) == (status, message)  # relayed as is
    attempts = 3 if status in (429, 500) else 1  # transient: retried twice first
    assert route.failure == ProviderFailure(status, message, attempts) and route.failed.is_set()
    tries = " (after 3 attempts)" if attempts == 3 else ""
    assert str(route.failure) == f"provider answered {status}{tries}: {message}"
    assert len(up.seen) == attempts
    up.answer, up.status = {"error": {"message": "second", "type": "server_error"}}, 503
    await post(http, proxy, body(proxy, route))
    assert route.failure.message == message  # the first failure is the cause
    assert route.calls == 2


async def test_non_json_error_and_dead_upstream_are_failures_with_status(proxy, http):
    async def answer(request: web.Request) -> web.Response:
        return web.Response(status=418, text="teapot says no")

    app = web.Application()
    app.router.add_post("/v1/responses", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        route = proxy.open_route(f"http://127.0.0.1:{runner.addresses[0][1]}/v1", "s")
        status, reply = await post(http, proxy, body(proxy, route))
        assert status == 418 and "teapot says no" in reply["error"]["message"]
        assert route.failure == ProviderFailure(418, "teapot says no")  # a 4xx: one attempt
    finally:
        await runner.cleanup()
    dead = proxy.open_route("http://127.0.0.1:9/v1", "s")  # discard port: nothing listens
    await post(http, proxy, body(proxy, dead))
    assert dead.failure is not None and dead.failure.status == 502
    assert dead.failure.attempts == 3  # a refused connection is transient


async def test_provider_texts_are_redacted_and_secrets_live_only_while_open(proxy, upstream, http):
    up, endpoint = upstream
    bearer = "rollout-secret-0123456789"
    echo = f"bad request: bearer {bearer}, proxy {proxy.secret}"
    up.answer, up.status = {"error": {"message": echo, "type": "invalid_request_error"}}, 400
    async with proxy.route(endpoint, bearer) as route:
        await post(http, proxy, body(proxy, route))
        assert route.failure is not None
        text = str(route.failure)
        assert bearer not in text and proxy.secret not in text
        assert text.count(redact.REDACTED) == 2
        assert redact.redact(bearer) == redact.REDACTED
    assert redact.redact(bearer) == bearer  # forgotten with its route
    assert redact.redact(proxy.secret) == redact.REDACTED  # until the proxy stops
    await proxy.stop()
    assert redact.redact(proxy.secret) == proxy.secret


async def test_route_tag_is_the_one_routing_form(proxy, upstream, http):
    up, endpoint = upstream
    route = proxy.open_route(endpoint, "bearer-secret")
    row = {"responses_create_params": {"input": "hi", "metadata": {"k": "v"}}, "x": 1}
    tagged = route.tag(row)
    assert tagged["responses_create_params"]["metadata"] == {
        "k": "v",
        ROUTE_KEY: route.id,
        SECRET_KEY: proxy.secret,
    }
    assert row["responses_create_params"]["metadata"] == {"k": "v"}  # the row is untouched
    assert tag_row(row, route.id, proxy.secret) == tagged  # another process's form
    status, _ = await post(http, proxy, tagged["responses_create_params"])
    assert status == 200 and route.calls == 1
    assert up.seen[-1]["body"]["metadata"] == {"k": "v"}  # routing keys never go upstream


async def test_ng_rollout_paths_route_and_authenticate_by_the_path(proxy, upstream, http):
    """NeMo Gym >= 0.7 with rollout correlation on calls `/ng-rollout/<row's _ng_rollout_id>/v1/
    ...`, and its coding-agent CLIs carry nothing else of the rollout: the tagged rollout id
    (route id + credential) routes and authenticates the call by its path alone, any dialect."""
    up, endpoint = upstream
    ids = [proxy.open_route(endpoint, f"s{i}").rollout_id for i in range(200)]
    assert all(ROLLOUT_ID_PATTERN.match(i) for i in ids)  # any rollout id is valid for NeMo Gym
    route = proxy.open_route(endpoint, "bearer-secret")
    tagged = route.tag({"responses_create_params": {"input": "hi"}})
    assert tagged[ROLLOUT_ID_KEY] == route.rollout_id != route.id
    assert (
        tag_row({"responses_create_params": {}}, route.id, proxy.secret)[ROLLOUT_ID_KEY]
        == route.rollout_id
    )  # another process's form

    async def post_at(rollout_id: str, payload: dict[str, Any], tail: str = "responses"):
        url = f"{proxy.url}/ng-rollout/{rollout_id}/v1/{tail}"
        headers = {"Authorization": "Bearer EMPTY"}  # what NeMo Gym gives its CLIs
        async with http.post(url, json=payload, headers=headers) as r:
            return r.status, await r.json()

    for payload in ({"input": "hi"}, tagged["responses_create_params"]):
        status, reply = await post_at(route.rollout_id, payload)
        assert status == 200, reply
        assert reply["output"][0]["content"][0]["text"] == "bearer-secret"  # this route's
        assert up.seen[-1]["path"] == "/v1/responses"  # the prefix never goes upstream
        assert "metadata" not in up.seen[-1]["body"]  # nor our routing keys
    assert route.calls == 2 and proxy.rollout_path_calls == 2
    only_secret = {"input": "hi", "metadata": {SECRET_KEY: proxy.secret}}
    forged = route.rollout_id[:-1] + ("0" if route.rollout_id[-1] != "0" else "1")
    other = NeMoGymModelProxy()  # a credential another proxy's secret made
    foreign = tag_row({"responses_create_params": {}}, route.id, other.secret)[ROLLOUT_ID_KEY]
    for refused in (route.id, forged, foreign, f"{route.id}."):
        status, reply = await post_at(refused, only_secret)
        assert (status, reply["error"]["type"]) == (401, "unauthorized"), refused
    assert route.failure is None  # a forged call cannot fail a rollout
    status, reply = await post_at(rollout_id("no-such-route", proxy.secret), {})
    assert (status, reply["error"]["type"]) == (404, "unknown_route")
    for malformed in ("_x", ".x", "a%20b"):
        status, reply = await post_at(malformed, only_secret)
        assert status in (401, 404), malformed
    await proxy.close_route(route)
    status, reply = await post_at(route.rollout_id, {"input": "hi"})
    assert (status, reply["error"]["type"]) == (410, "route_finished")
    assert ROLLOUT_ID_PATTERN.match(route.id)  # a path segment NeMo Gym accepts
    assert len(up.seen) == 2


async def test_refused_rollout_calls_are_refused_before_their_body_is_read(proxy, upstream):
    """A call on a rollout path without the right credential is answered before one byte of its
    body is read: the client still sending a large body gets its 401 first."""
    up, endpoint = upstream
    route = proxy.open_route(endpoint, "b")
    forged = f"{route.id}.{'0' * 32}"
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    try:
        writer.write(
            f"POST /ng-rollout/{forged}/v1/chat/completions HTTP/1.1\r\n"
            f"Host: x\r\nContent-Type: application/json\r\nContent-Length: {10**9}\r\n\r\n".encode()
        )
        writer.write(b"{" + b" " * 65536)  # a sliver of the gigabyte it announced
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 401"), head
    finally:
        writer.close()
    assert up.seen == [] and route.calls == 0


async def test_dead_upstream_is_502_not_a_dropped_connection(proxy, http):
    route = proxy.open_route("http://127.0.0.1:9/v1", "s").id  # discard port: nothing listens
    status, reply = await post(http, proxy, body(proxy, route))
    assert status == 502 and reply["error"]["type"] == "upstream_error"


async def test_large_bodies_pass_and_oversized_are_413(proxy, upstream, http):
    up, endpoint = upstream
    route = proxy.open_route(endpoint, "s")
    big = "x" * (6 * 1024 * 1024)
    status, _ = await post(http, proxy, body(proxy, route, instructions=big))
    assert status == 200 and up.seen[-1]["body"]["instructions"] == big
    status, reply = await post(http, proxy, body(proxy, route, instructions=big * 2))
    assert status == 413 and reply["error"]["type"] == "request_too_large"


async def test_malformed_json_is_400_once_authenticated_else_401(proxy, http):
    auth = {"Authorization": f"Bearer {proxy.secret}"}
    async with http.post(f"{proxy.url}/v1/responses", data=b"{not json", headers=auth) as r:
        assert r.status == 400
        assert "not JSON" in json.loads(await r.text())["error"]["message"]
    async with http.post(f"{proxy.url}/v1/responses", data=b"{not json") as r:
        assert r.status == 401  # an unauthenticated body is not even parsed


@pytest.mark.parametrize("server", ["proxy", "front"])
async def test_unauthenticated_bodies_are_refused_before_parsing(
    server: str, proxy, http, monkeypatch: pytest.MonkeyPatch
):
    """A 6 MB body of 1.5 million small objects (what cost 27x its size in memory when parsed)
    without the secret, with a wrong one, a non-ASCII one: 401, and no JSON parse anywhere
    (counted at the parser both servers would use)."""
    from verifiers_nemogym.bridge.front import FrontForwarder, FrontUser, secret_digest

    parses = []
    real = pydantic_core.from_json
    monkeypatch.setattr(
        pydantic_core, "from_json", lambda *a, **k: parses.append(1) or real(*a, **k)
    )
    big = {"input": [{}] * 1_500_000}
    bodies = [
        big,
        {**big, "metadata": {SECRET_KEY: "wrong-secret"}},
        {"input": "hi", "metadata": {SECRET_KEY: "\u00e9t\u00e9"}},
    ]
    async with FrontForwarder() as front:
        front.add(FrontUser(1, proxy.url, secret_digest(proxy.secret)))
        url = f"{front.url if server == 'front' else proxy.url}/v1/responses"
        for payload in bodies:
            async with http.post(url, data=json.dumps(payload).encode()) as r:
                assert r.status == 401, await r.text()
        async with http.post(url, data=b"x", headers={"Authorization": "Bearer \u00e9"}) as r:
            assert r.status == 401
    assert parses == []


async def test_a_route_id_that_is_not_a_string_is_404(proxy, http):
    metadata = {SECRET_KEY: proxy.secret, ROUTE_KEY: ["x"]}
    async with http.post(
        f"{proxy.url}/v1/responses", json={"input": "hi", "metadata": metadata}
    ) as r:
        assert r.status == 404


async def test_train_route_carries_responses_calls_as_chat(proxy, upstream, http):
    """A train route (verifiers' train client) posts Chat Completions and answers Responses;
    an overlong prompt's 400 and a stop become `incomplete`; other errors stay failures."""
    up, endpoint = upstream
    call = {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    up.answer = {
        "id": "chatcmpl-1",
        "choices": [
            {
                "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                "finish_reason": "tool_calls",
            }
        ],
    }
    stopped: list[str] = []
    route = proxy.open_route(
        endpoint, "s", stop_condition=lambda: stopped[0] if stopped else None, train=True
    )
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    got, reply = await post(http, proxy, body(proxy, route, tools=tools))
    assert got == 200
    assert [(i["type"], i["call_id"]) for i in reply["output"]] == [("function_call", "call_0")]
    Response.model_validate(reply)
    (seen,) = up.seen
    assert seen["path"] == "/v1/chat/completions"
    assert seen["body"]["messages"] == [{"role": "user", "content": "hi"}]
    assert "metadata" not in seen["body"]  # the route and secret reach no model call

    up.answer, up.status = (
        {"error": {"message": "Prompt length (9) exceeds maximum context length (5)."}},
        400,
    )
    got, reply = await post(http, proxy, body(proxy, route))
    assert got == 200 and reply["status"] == "incomplete"
    assert reply["incomplete_details"] == {"reason": "max_output_tokens"}
    stopped.append("max_turns")
    up.answer = {"error": {"message": "rollout stopped: max_turns"}}
    got, reply = await post(http, proxy, body(proxy, route))
    assert got == 200 and reply["status"] == "incomplete"
    assert route.failure is None

    got, reply = await post(http, proxy, body(proxy, route, tools=[{"type": "web_search"}]))
    assert got == 400 and "request.tools[0]" in reply["error"]["message"]
    assert len(up.seen) == 3  # refused before anything went upstream
    assert route.failure is not None and route.failure.status == 400

    other = proxy.open_route(endpoint, "t", stop_condition=lambda: None, train=True)
    up.answer, up.status = {"error": {"message": "boom"}}, 500
    got, reply = await post(http, proxy, body(proxy, other))
    assert (got, reply["error"]["message"]) == (500, "boom")
    assert other.failure == ProviderFailure(500, "boom", attempts=3)  # retried, as in eval mode


class SlowUpstream:
    """An endpoint that answers after `delay` seconds, or never (`delay` None); tells when a
    call came in (`received`) and when one ended without an answer (`abandoned`: its client
    went away)."""

    def __init__(self, delay: float | None) -> None:
        self.delay = delay
        self.received = asyncio.Event()
        self.abandoned = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        self.received.set()
        try:
            await asyncio.sleep(self.delay if self.delay is not None else 3600)
        except asyncio.CancelledError:
            self.abandoned.set()
            raise
        return web.json_response({"output": []})


@contextlib.asynccontextmanager
async def slow_upstream(delay: float | None) -> AsyncIterator[tuple[SlowUpstream, str]]:
    up = SlowUpstream(delay)
    app = web.Application()
    app.router.add_post("/v1/{tail:.*}", up.handle)
    # handler_cancellation: the endpoint notices a client that goes away (what we assert).
    async with serve_upstream(app) as url:
        yield up, url


@contextlib.asynccontextmanager
async def serve_upstream(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()


async def test_calls_beyond_the_pool_wait_for_a_connection_and_succeed(http):
    """Pool of 2, three 2 s calls at once: the third waits for a slot (longer than the 1 s
    connect timeout) and still succeeds."""
    limits = ProxyLimits(pool_size=2, connect_timeout=1, call_timeout=30)
    async with slow_upstream(2.0) as (_, endpoint), NeMoGymModelProxy(limits=limits) as proxy:
        routes = [proxy.open_route(endpoint, "s") for _ in range(3)]
        results = await asyncio.gather(*(post(http, proxy, body(proxy, r)) for r in routes))
    assert [status for status, _ in results] == [200, 200, 200], results


async def test_the_front_lets_calls_beyond_its_pool_wait_too(http):
    from verifiers_nemogym.bridge.front import FrontForwarder, FrontUser, secret_digest

    async with (
        slow_upstream(2.0) as (_, endpoint),
        NeMoGymModelProxy() as proxy,
        FrontForwarder(pool_size=2, connect_timeout=1) as front,
    ):
        front.add(FrontUser(1, proxy.url, secret_digest(proxy.secret)))
        routes = [proxy.open_route(endpoint, "s") for _ in range(3)]

        async def call(route: Route) -> int:
            async with http.post(f"{front.url}/v1/responses", json=body(proxy, route)) as r:
                return r.status

        # The third waits ~2 s for a connection: beyond the front's 1 s connect bound.
        assert await asyncio.gather(*(call(r) for r in routes)) == [200, 200, 200]


async def test_closing_a_route_cancels_its_calls_still_upstream(http):
    async with slow_upstream(None) as (up, endpoint), NeMoGymModelProxy() as proxy:
        route = proxy.open_route(endpoint, "s")
        pending = asyncio.ensure_future(post(http, proxy, body(proxy, route)))
        await asyncio.wait_for(up.received.wait(), 10)  # the call is upstream now
        assert len(route.inflight) == 1
        await proxy.close_route(route)
        await asyncio.wait_for(up.abandoned.wait(), 2)  # the endpoint saw the call go away
        status, reply = await asyncio.wait_for(pending, 2)
        assert status == 410 and reply["error"]["type"] == "route_finished"
        assert route.inflight == set()


async def test_a_refused_call_fails_no_route_it_names(proxy, upstream, http):
    """A call that proves no route (no secret, a wrong one, a forged path credential) is 401
    and changes nothing for the open route it names, by header, body or path: whoever can reach
    the proxy (a container through the door) cannot fail a neighbour's rollout. The route's own
    calls go on as before."""
    _, endpoint = upstream
    route = proxy.open_route(endpoint, "bearer")
    victim = route.id
    forged = f"{victim}.{'0' * 32}"
    attempts: list[tuple[str, Any, dict[str, str]]] = [
        ("/v1/responses", {"input": "hi"}, {ROUTE_HEADER: victim}),
        ("/v1/responses", {"input": "hi", "metadata": {ROUTE_KEY: victim}}, {}),
        ("/v1/responses", {"input": "hi", "metadata": {ROUTE_KEY: victim, SECRET_KEY: "no"}}, {}),
        ("/v1/chat/completions", {"metadata": {ROUTE_KEY: victim}}, {ROUTE_HEADER: victim}),
        ("/v1/messages", {}, {ROUTE_HEADER: victim, "Authorization": "Bearer not-the-secret"}),
        (f"/ng-rollout/{forged}/v1/chat/completions", {}, {ROUTE_HEADER: victim}),
        (f"/ng-rollout/{victim}/v1/chat/completions", {"metadata": {ROUTE_KEY: victim}}, {}),
    ]
    for path, payload, headers in attempts:
        async with http.post(f"{proxy.url}{path}", json=payload, headers=headers) as r:
            assert r.status == 401, (path, payload, headers, r.status)
    assert route.failure is None and not route.failed.is_set()
    assert route.calls == 0
    status, _ = await post(http, proxy, body(proxy, route))
    assert status == 200 and route.failure is None and route.calls == 1


def test_secrets_in_their_wire_form_are_redacted_live_or_not():
    """M1: another process's (or a finished) proxy secret in a row quoted by a death notice,
    and any bearer token, come out redacted though this process never registered them."""
    text = 'died: {"metadata": {"vf_nemogym_secret": "someone-elses-secret-123"}} Bearer abc.def-1'
    clean = redact.redact(text)
    assert "someone-elses-secret-123" not in clean and "abc.def-1" not in clean
    assert '"vf_nemogym_secret": "[redacted]"' in clean and "Bearer [redacted]" in clean


def test_a_secret_straddling_a_cut_is_never_kept_in_part():
    """M1: for every offset at which a cut would split a live secret, no 8 characters of it
    survive (cut first with a margin, then redact, then cut)."""
    secret = "S" + "0123456789abcdefghijklmnopqrstuvwxyzABCDEF"  # 43 characters
    redact.protect(secret)
    try:
        for offset in range(len(secret) + 1):
            text = "x" * (100 - offset) + secret + "y" * 50
            for kept in (redact.cut(text, 100), redact.cut(text, 100 + 50, keep="tail")):
                assert not any(secret[i : i + 8] in kept for i in range(len(secret) - 7)), kept
    finally:
        redact.forget(secret)


# --- transient provider errors: retried like the OpenAI SDK retries them -----------------------


@contextlib.asynccontextmanager
async def scripted_route(
    limits: ProxyLimits | None = None, retry_after: str | None = None
) -> AsyncIterator[tuple[ScriptedPolicy, NeMoGymModelProxy, Route]]:
    """The scripted policy (its `[fault:...]` triggers) behind a real proxy with one open route
    (default limits: the real retry curve)."""
    async with (
        ScriptedPolicy(retry_after=retry_after) as policy,
        NeMoGymModelProxy(limits=limits) as proxy,
    ):
        yield policy, proxy, proxy.open_route(policy.base_url, "bearer-secret-0001")


def ask(proxy: NeMoGymModelProxy, route: Route, text: str) -> dict[str, Any]:
    return body(proxy, route, input=[{"role": "user", "content": text}])


async def test_a_429_is_retried_after_its_retry_after_then_succeeds(http):
    async with scripted_route(retry_after="1") as (policy, proxy, route):
        began = asyncio.get_running_loop().time()
        status, reply = await post(http, proxy, ask(proxy, route, "[fault:429x1] weather?"))
        waited = asyncio.get_running_loop().time() - began
    assert status == 200 and reply["output"], reply
    assert route.failure is None and not route.failed.is_set()
    # Sent twice, the retry marked as one (verifiers replays a turn it already committed).
    assert [c.retry_count for c in policy.calls] == [None, "1"]
    assert (route.calls, route.retries) == (1, 1)
    assert waited >= 1.0  # Retry-After: 1, not the 0.5 s backoff


async def test_503_twice_then_success_is_a_success(http):
    async with scripted_route() as (policy, proxy, route):
        status, reply = await post(http, proxy, ask(proxy, route, "[fault:503x2] weather?"))
    assert status == 200 and reply["output"], reply
    assert route.failure is None
    assert [c.retry_count for c in policy.calls] == [None, "1", "2"]


async def test_503_forever_fails_after_three_attempts_within_the_backoff_bound(http):
    async with scripted_route() as (policy, proxy, route):
        began = asyncio.get_running_loop().time()
        status, reply = await post(http, proxy, ask(proxy, route, "[fault:503] weather?"))
        took = asyncio.get_running_loop().time() - began
    assert status == 503 and reply["error"]["message"] == "scripted fault 503"
    assert route.failure == ProviderFailure(503, "scripted fault 503", attempts=3)
    assert "after 3 attempts" in str(route.failure)
    assert len(policy.calls) == 3  # 1 + 2 retries, counted where they arrive
    # Backoff 0.5 s then 1 s, each shortened by up to a quarter: at most 1.5 s of waiting.
    assert 1.1 <= took < 5, took


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
async def test_a_4xx_that_is_not_transient_is_never_retried(http, status):
    async with scripted_route() as (policy, proxy, route):
        got, _ = await post(http, proxy, ask(proxy, route, f"[fault:{status}] weather?"))
    assert got == status and route.failure is not None and route.failure.attempts == 1
    assert len(policy.calls) == 1


async def test_a_retry_after_beyond_the_cap_is_not_waited_for(http):
    limits = ProxyLimits(retry=RetryPolicy(max_retry_after=0.5))
    async with scripted_route(limits, retry_after="30") as (policy, proxy, route):
        got, _ = await post(http, proxy, ask(proxy, route, "[fault:429] weather?"))
    assert got == 429 and len(policy.calls) == 1 and route.failure is not None


async def test_closing_the_route_cancels_a_retry_waiting_for_its_backoff(http):
    async with scripted_route(retry_after="30") as (policy, proxy, route):
        pending = asyncio.ensure_future(post(http, proxy, ask(proxy, route, "[fault:429] w?")))
        # The first 429 is in: the proxy counts the retry, then waits 30 s for it.
        await until(lambda: route.retries == 1, 10, "the proxy to wait for its retry")
        assert len(policy.calls) == 1 and len(route.inflight) == 1
        await proxy.close_route(route)  # the rollout's deadline
        status, reply = await asyncio.wait_for(pending, 2)
    assert status == 410 and reply["error"]["type"] == "route_finished"
    assert len(policy.calls) == 1  # no retry after the route closed


async def test_a_connection_dropped_mid_answer_is_retried(proxy, http):
    """A body cut off by a dropped connection (what a garbled transfer looks like to a client)
    is transient; the retry succeeds."""
    seen: list[str | None] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("x-stainless-retry-count"))
        if len(seen) == 1:
            reply = web.StreamResponse(headers={"Content-Length": "1000"})
            await reply.prepare(request)
            await reply.write(b'{"output": [')
            assert request.transport is not None
            request.transport.close()
            return reply
        return web.json_response({"output": []})

    app = web.Application()
    app.router.add_post("/v1/responses", answer)
    async with serve_upstream(app) as endpoint:
        route = proxy.open_route(endpoint, "s")
        status, reply = await post(http, proxy, body(proxy, route))
    assert status == 200 and reply["output"] == []
    assert seen == [None, "1"] and route.failure is None


async def test_a_200_that_is_not_json_is_not_retried(proxy, http):
    """From verifiers' interception a 200 is a turn it committed: a retry would only replay it.
    (verifiers turns a garbled provider answer into a 502, which is retried.)"""
    async with ScriptedPolicy() as policy:
        route = proxy.open_route(policy.base_url, "s")
        status, _ = await post(http, proxy, ask(proxy, route, "[fault:garbage] weather?"))
    assert status == 502 and len(policy.calls) == 1
    assert route.failure is not None and route.failure.attempts == 1
