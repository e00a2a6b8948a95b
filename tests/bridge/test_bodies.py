"""Bodies in bounded memory (`wire.BodyReader`): every listener of ours (front, model proxy, judge
relay) answers callers without a credential 4xx while holding at most its unauthenticated budget
of their bytes, makes readers beyond the budget wait (TCP pushes back on their senders), and
still takes a large body from a caller with its credential."""

from __future__ import annotations

import asyncio
import json
import subprocess
import tracemalloc
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import web
from helpers.load import unauthenticated_load
from helpers.processes import until

from verifiers_nemogym.bridge import wire
from verifiers_nemogym.bridge.front import FrontForwarder, FrontUser, secret_digest
from verifiers_nemogym.bridge.proxy import NeMoGymModelProxy
from verifiers_nemogym.bridge.wire import (
    CONNECTIONS_SHARE,
    READ_CHUNK,
    SECRET_KEY,
    UNAUTHENTICATED_BUDGET,
    ByteBudget,
    ConnectionGate,
    route_metadata,
)
from verifiers_nemogym.judge.endpoint import Judge
from verifiers_nemogym.judge.relay import JudgeRelay
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.net import LINGERING_TIME
from verifiers_nemogym.policies.judge import ScriptedJudge

MB = 1024 * 1024
PIECE = b"x" * READ_CHUNK
CALLERS = 64
"""Concurrent callers without a credential per listener."""


async def _unauthenticated(size: int, secret: bytes = b"wrong") -> AsyncIterator[bytes]:
    """A JSON body of about `size` bytes, made as it is sent (never held by the test), with a
    wrong secret at its end."""
    yield b'{"input": "'
    for _ in range(size // len(PIECE)):
        yield PIECE
    yield b'", "metadata": {"' + SECRET_KEY.encode() + b'": "' + secret + b'"}}'


async def _status(http: aiohttp.ClientSession, url: str, data: Any, **kw: Any) -> int:
    async with http.post(url, data=data, **kw) as r:
        await r.read()
        return r.status


@pytest.fixture
async def listeners(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[dict[str, str]]:
    """The three listeners, each's model-call URL; the front knows the proxy. Parametrized
    indirectly: the seconds aiohttp gives a connection to send a whole request head."""
    if (head_timeout := getattr(request, "param", None)) is not None:
        handler_args = {**ConnectionGate.handler_args, "keepalive_timeout": head_timeout}
        monkeypatch.setattr(ConnectionGate, "handler_args", handler_args)
    async with (
        ScriptedJudge() as judge,
        JudgeRelay(Judge(base_url=judge.base_url, model="m")) as relay,
        NeMoGymModelProxy() as proxy,
        FrontForwarder() as front,
    ):
        front.add(FrontUser(1, proxy.url, secret_digest(proxy.secret)))
        yield {
            "front": f"{front.url}/v1/responses",
            "proxy": f"{proxy.url}/v1/responses",
            "relay": f"{relay.base_url}/chat/completions",
        }


T = TypeVar("T")


async def peak_growth_mb(work: Awaitable[T]) -> tuple[T, float]:
    """`work`'s result and the peak of this process's Python memory (tracemalloc) above what it
    held when `work` began, in MB."""
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        result = await work
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, (peak - base) / MB


async def test_unauthenticated_load_on_every_listener_holds_at_most_the_budget(listeners):
    """64 concurrent 4 MB bodies without a credential to each listener (192 connections, 768 MB
    in all), sent from another process: each answered 401, and this process's Python memory
    (the three listeners) peaks under the 16 MiB budget: what aiohttp buffers for the
    connections it reads (8 at once, `ConnectionGate`) and the bodies read (`BodyReader`).
    Without the gate, aiohttp's own buffer of each connection came on top (up to 0.36 MB)."""
    gate = wire.shared_gate()
    gate.budget.peak = 0
    statuses, growth = await peak_growth_mb(
        unauthenticated_load(list(listeners.values()), CALLERS, 4 * MB)
    )
    assert statuses == [401] * len(listeners) * CALLERS, statuses
    print(f"peak Python memory growth {growth:.1f} MB for {len(statuses)} connections")
    assert growth < UNAUTHENTICATED_BUDGET / MB, f"peak Python memory grew {growth:.1f} MB"
    # A handler gives its allowance back once its answer is written, which the caller may read
    # first: the last ones come back within moments (CI once saw 1 MiB still out at once).
    for _ in range(50):
        if gate.budget.used == 0:
            break
        await asyncio.sleep(0.1)
    assert gate.budget.peak == CONNECTIONS_SHARE and gate.budget.used == 0


@pytest.mark.parametrize("listeners", [1.0], indirect=True)
async def test_slow_large_request_heads_hold_at_most_the_connections_share(listeners):
    """64 connections to each listener send a 250 KB request head (62 header lines of 4 KB,
    within aiohttp's limits for our listeners, `HEAD_LIMITS`) and never finish it: aiohttp
    reads 8 at once (`ConnectionGate`), so this process's Python memory peaks under the gate's
    share of the budget (8 MiB; without the gate, every head is read: about 0.6 MB each with
    aiohttp's copies); aiohttp hangs up on each once its head is late (1 s here, 30 s served),
    the waiting ones too, and every allowance comes back."""
    gate = wire.shared_gate()
    gate.budget.peak = 0
    answers, growth = await peak_growth_mb(
        unauthenticated_load(list(listeners.values()), CALLERS, 62 * 4016, heads=True, timeout=60)
    )
    assert set(answers) == {"closed"}, answers
    print(f"peak Python memory growth {growth:.1f} MB for {len(answers)} connections")
    assert growth < CONNECTIONS_SHARE / MB, f"peak Python memory grew {growth:.1f} MB"
    assert gate.budget.peak == CONNECTIONS_SHARE and gate.budget.used == 0


async def test_connections_beyond_the_gate_are_not_read():
    """With the gate's share held (8 heads never finished), 200 more connections each sending
    a head and 64 KB of body wait unread: each costs this process under 16 KB (its transport
    and aiohttp handler objects, and the client's end, which is here too), not its bytes."""
    async with NeMoGymModelProxy() as proxy:
        gate, writers = proxy._bodies.gate, []
        for _ in range(CONNECTIONS_SHARE // gate.allowance):
            _, writer = await asyncio.open_connection(proxy.host, proxy.port)
            writer.write(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\n")
            writers.append(writer)
        await until(lambda: gate.budget.used == CONNECTIONS_SHARE, 5, "the share to be held")
        head = b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"
        tracemalloc.start()
        try:
            base, _ = tracemalloc.get_traced_memory()
            for _ in range(200):
                _, writer = await asyncio.open_connection(proxy.host, proxy.port)
                writer.write(head + b"x" * 65536)
                writers.append(writer)
            await until(lambda: len(gate._waiting) == 200, 10, "200 connections to wait")
            await asyncio.sleep(0.5)  # time to read them, were they read
            used, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        per_connection = (used - base) / 200 / 1024
        print(f"{per_connection:.1f} KB per waiting connection")
        assert per_connection < 16, f"{per_connection:.1f} KB per waiting connection"
        for writer in writers:
            writer.close()
        await until(lambda: gate.budget.used == 0 and not gate._waiting, 10, "all to leave")


async def test_an_admitted_connection_leaves_the_gate_and_a_refused_one_is_closed():
    """A caller with its credential holds an allowance only until it is admitted, and keeps its
    connection for its next call; a caller answered without being admitted has its connection
    closed with the answer (`Connection: close`), and its allowance comes back."""
    async with (
        ScriptedJudge() as judge,
        JudgeRelay(Judge(base_url=judge.base_url, model="m")) as relay,
        aiohttp.ClientSession() as http,
    ):
        gate = wire.shared_gate()
        call = {"model": "m", "messages": [{"role": "user", "content": "2+2?"}]}
        auth = {"Authorization": f"Bearer {relay.token}"}
        url = f"{relay.base_url}/chat/completions"
        for _ in range(2):
            async with http.post(url, json=call, headers=auth) as r:
                assert r.status == 200 and "Connection" not in r.headers
            assert gate.budget.used == 0 and len(http.connector._conns) == 1  # type: ignore[union-attr]
        async with aiohttp.ClientSession() as other:  # its own connections
            async with other.get(relay.url) as r:  # `GET /`, no credential needed
                assert r.status == 200 and r.headers["Connection"] == "close"
            async with other.post(url, json=call) as r:
                assert r.status == 401 and r.headers["Connection"] == "close"
        await until(lambda: gate.budget.used == 0, 5, "the refused connections to close")


async def test_readers_beyond_the_budget_wait_and_tcp_pushes_back():
    """With a budget of one read: a caller that stalls mid-body holds it; a second caller's
    handler waits for the budget without reading, so its 32 MB cannot all be sent (the socket
    does not drain); once the first caller goes, the second is read and refused."""
    async with NeMoGymModelProxy() as proxy:
        proxy._bodies = wire.BodyReader(budget=ByteBudget(READ_CHUNK))
        head = (
            f"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {32 * MB}\r\n\r\n"
        ).encode()
        _, staller = await asyncio.open_connection(proxy.host, proxy.port)
        staller.write(head + b'{"input": "')
        await staller.drain()
        await asyncio.sleep(0.3)  # its handler now waits for the rest, holding the budget
        reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
        writer.write(head)
        writer.write(b"x" * (32 * MB))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(writer.drain(), 2)
        assert len(proxy._bodies.budget._waiters) == 1
        assert proxy._bodies.budget.used == READ_CHUNK
        staller.close()
        await asyncio.wait_for(writer.drain(), 30)
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        assert answer.startswith(b"HTTP/1.1 401"), answer
        writer.close()
    assert proxy._bodies.budget.used == 0


async def test_a_large_body_with_its_secret_at_the_end_goes_through_front_and_proxy():
    """NeMo Gym puts `metadata` after `input`: a 24 MB call whose secret comes last passes the
    front and the proxy unchanged (spilled past the memory it may hold before its secret)."""
    seen: list[int] = []

    async def upstream(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(len(body["input"]))
        return web.json_response({"output": []})

    app = web.Application(client_max_size=1024**3)
    app.router.add_post("/v1/responses", upstream)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        async with NeMoGymModelProxy() as proxy, FrontForwarder() as front:
            front.add(FrontUser(1, proxy.url, secret_digest(proxy.secret)))
            route = proxy.open_route(f"http://127.0.0.1:{runner.addresses[0][1]}/v1", "b")
            big = "y" * (24 * MB)
            data = json.dumps({"input": big, "metadata": route_metadata(route.id, proxy.secret)})
            async with aiohttp.ClientSession() as http:
                assert await _status(http, f"{front.url}/v1/responses", data.encode()) == 200
            assert seen == [len(big)]
            assert front._bodies.budget.used == proxy._bodies.budget.used == 0
    finally:
        await runner.cleanup()


async def test_the_relay_takes_a_large_body_with_its_token():
    async with ScriptedJudge() as judge, JudgeRelay(Judge(judge.base_url, "m")) as relay:
        content = "z" * (12 * MB)
        body = {"model": "m", "messages": [{"role": "user", "content": content}]}
        async with aiohttp.ClientSession() as http:
            status = await _status(
                http,
                f"{relay.base_url}/chat/completions",
                json.dumps(body).encode(),
                headers={"Authorization": f"Bearer {relay.token}"},
            )
        assert status == 200 and judge.calls[-1].prompt == content


async def test_temporary_files_are_bounded_too():
    """Past its memory share a body goes to a temporary file; a process keeps at most
    `spooled.limit` bytes there: a caller beyond is 503 (retried by NeMo Gym), never the disk."""
    async with NeMoGymModelProxy() as proxy:
        proxy._bodies = wire.BodyReader(spooled=ByteBudget(4 * MB))
        async with aiohttp.ClientSession() as http:
            url = f"{proxy.url}/v1/responses"
            assert await _status(http, url, _unauthenticated(2 * MB)) == 401  # fits
            assert await _status(http, url, _unauthenticated(8 * MB)) == 503
        assert proxy._bodies.spooled.used == 0 and proxy._bodies.spooled.peak <= 4 * MB


async def test_a_caller_too_slow_before_its_secret_is_408_then_hung_up_on(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(wire, "UNAUTHENTICATED_READ_TIMEOUT", 0.3)
    async with NeMoGymModelProxy() as proxy:
        reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
        writer.write(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert proxy._bodies.budget.used == 0
        # The rest of the announced body is waited for `LINGERING_TIME`, then the server hangs up.
        began = asyncio.get_running_loop().time()
        await asyncio.wait_for(reader.read(), 10)
        assert asyncio.get_running_loop().time() - began < LINGERING_TIME + 1
        writer.close()


@pytest.mark.parametrize("listener", ["front", "proxy", "relay"])
async def test_an_announced_body_over_the_limit_is_413_before_it_is_read(listener, listeners):
    reader, writer = await asyncio.open_connection(*listeners[listener].split("/")[2].split(":"))
    path = "/" + listeners[listener].split("/", 3)[3]
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {wire.MAX_BODY_BYTES + 1}\r\n"
        f"Authorization: Bearer whatever\r\n\r\n{{".encode()
    )
    await writer.drain()
    answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert answer.startswith(b"HTTP/1.1 413"), answer
    writer.close()


def test_the_scan_finds_an_entry_cut_anywhere_between_two_reads():
    entry = b'"' + SECRET_KEY.encode() + b'": "s3cr3t-token_x"'
    route = b'"vf_nemogym_route": "r.1"'
    body = b'{"input": "' + b"a" * 300 + b'", "metadata": {' + route + b", " + entry + b"}}"
    for cut in range(len(body) + 1):
        scan = wire._Scan()
        found = scan.feed(body[:cut]) + scan.feed(body[cut:])
        assert found == [b"s3cr3t-token_x"], cut
        assert scan.route == "r.1", cut


def test_the_scan_stops_trying_after_a_few_secrets():
    scan = wire._Scan()
    entries = b"".join(b'"' + SECRET_KEY.encode() + b'": "w%d", ' % i for i in range(6))
    assert len(scan.feed(entries)) == 4 and scan.exhausted


async def test_the_budget_is_first_come_first_served_and_a_cancelled_wait_leaks_nothing():
    budget = ByteBudget(10)
    await budget.take(8)
    order: list[str] = []

    async def take(name: str, n: int) -> None:
        await budget.take(n)
        order.append(name)

    first = asyncio.create_task(take("first", 5))
    cancelled = asyncio.create_task(take("cancelled", 5))
    await asyncio.sleep(0)
    assert not budget.try_take(1)  # others wait: no overtaking
    cancelled.cancel()
    await asyncio.sleep(0)
    budget.give(8)
    await first
    assert order == ["first"] and budget.used == 5 and budget.peak == 8
    budget.give(5)
    assert budget.used == 0 and budget.try_take(10)


NEMO_GYM_BODY = r"""
import json, sys
import orjson
from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming as Params

row = json.loads(sys.stdin.read())
body = Params.model_validate(row["responses_create_params"])
# What NeMo Gym's simple_agent sends each turn: the body with the turn's input, dumped in field
# order (`ServerClient.request`: `model_dump(exclude_unset=True)`, then orjson).
turn = body.model_copy(update={"input": body.input + []})
sys.stdout.buffer.write(orjson.dumps(turn.model_dump(exclude_unset=True)))
"""


def test_nemo_gym_sends_the_secret_after_the_input(nemo_venv_07: NeMoGymVenv):
    """Why a body is read past its first KiBs before it is refused: NeMo Gym 0.7 sends a call's
    fields in its model's order, `metadata` (the secret) after `input`, whatever order the row
    has (one NeMo Gym import: the newest release only)."""
    big = "q" * 200_000
    row = wire.tag_row(
        {"responses_create_params": {"input": [{"role": "user", "content": big}]}},
        "route-1",
        "s3cret",
    )
    row["responses_create_params"] = {  # metadata first in the row
        "metadata": row["responses_create_params"]["metadata"],
        "input": row["responses_create_params"]["input"],
    }
    sent = subprocess.run(
        [str(nemo_venv_07.bin("python")), "-c", NEMO_GYM_BODY],
        input=json.dumps(row).encode(),
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    assert sent.index(f'"{SECRET_KEY}"'.encode()) > sent.index(big.encode()) + len(big)
    scan = wire._Scan()
    assert scan.feed(sent) == [b"s3cret"]
