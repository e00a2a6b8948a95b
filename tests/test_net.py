"""`net.AppServer`, the lifecycle every aiohttp server of the package shares: each binds
127.0.0.1 (a free port when asked for 0), answers, and after `async with` nothing listens; a
`start()` that cannot bind raises OSError and leaves nothing open (client sessions included)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from verifiers_nemogym.bridge import redact
from verifiers_nemogym.bridge.front import FrontForwarder
from verifiers_nemogym.bridge.proxy import NeMoGymModelProxy
from verifiers_nemogym.net import LOOPBACK, AppServer, free_port
from verifiers_nemogym.policies.llama_generate import GenerateAdapter
from verifiers_nemogym.policies.replay import ReplayPolicy
from verifiers_nemogym.policies.scripted import ScriptedPolicy
from verifiers_nemogym.policies.token_server import TokenServer

# Each server, built on `port`, and a GET path it answers with 200.
SERVERS: dict[str, tuple[Callable[[int], AppServer], str]] = {
    "scripted": (lambda port: ScriptedPolicy(port=port), "/v1/models"),
    "replay": (lambda port: ReplayPolicy(port=port), "/v1/models"),
    "token_server": (lambda port: TokenServer(None, port=port), "/v1/models"),
    "generate_adapter": (
        lambda port: GenerateAdapter("http://127.0.0.1:9/v1", "m", 64, port=port),
        "/v1/models",
    ),
    "proxy": (lambda port: NeMoGymModelProxy(port=port), "/"),
    "front": (lambda port: FrontForwarder(port=port), "/"),
}


def _refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((LOOPBACK, port)) != 0


@pytest.mark.parametrize("name", sorted(SERVERS))
async def test_serves_on_loopback_then_stops(name: str) -> None:
    build, path = SERVERS[name]
    server = build(0)
    async with server as running:
        assert running is server and server.host == LOOPBACK and server.port > 0
        assert server.base_url == f"http://{LOOPBACK}:{server.port}/v1"
        async with aiohttp.ClientSession() as http, http.get(server.url + path) as r:
            assert r.status == 200, await r.text()
    assert _refused(server.port)
    await server.stop()  # idempotent


@pytest.mark.parametrize("name", sorted(SERVERS))
async def test_a_taken_port_raises_and_leaves_nothing_open(name: str) -> None:
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        server = SERVERS[name][0](taken.getsockname()[1])
        with pytest.raises(OSError):
            async with server:
                pytest.fail("a server started on a taken port")
    assert server._runner is None
    # What a subclass opened in start() before binding is closed again.
    if isinstance(server, GenerateAdapter):
        assert server._session is None
    if isinstance(server, FrontForwarder):
        assert server._http is None
    if isinstance(server, NeMoGymModelProxy):
        assert server._connector is None
        assert redact.redact(server.secret) == server.secret  # not left registered


def test_free_port_is_below_the_kernels_ephemeral_range_and_bindable():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    # Not the kernel's choice: outgoing connections' source ports and port-0 binds come from
    # the ephemeral range, where they could take the port before its program binds it.
    assert all(20_001 <= port < low for port in ports), ports
    assert len(ports) > 1  # drawn at random, not a fixed port two stacks would both pick
    for port in ports:
        with socket.socket() as sock:
            sock.bind((LOOPBACK, port))
