"""The shared stack's front forwarder with real proxies and the scripted policy (no NeMo Gym
needed): a call reaches only the proxy whose secret it carries, and never gets a status NeMo
Gym retries forever."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import pytest

from verifiers_nemogym.bridge.front import FrontForwarder, FrontUser, secret_digest
from verifiers_nemogym.bridge.proxy import NeMoGymModelProxy, Route
from verifiers_nemogym.bridge.wire import route_metadata
from verifiers_nemogym.policies.scripted import ScriptedPolicy


def _body(tag: dict[str, str]) -> dict[str, object]:
    return {"model": "m", "input": [{"role": "user", "content": "hi"}], "metadata": tag}


async def test_front_forwards_by_secret_only() -> None:
    front = FrontForwarder()
    await front.start()
    async with ScriptedPolicy() as policy:
        proxies = [NeMoGymModelProxy(), NeMoGymModelProxy()]
        for pid, proxy in enumerate(proxies):
            await proxy.start()
            front.add(FrontUser(pid, proxy.url, secret_digest(proxy.secret)))
        try:
            routes = [p.open_route(policy.base_url, "bearer") for p in proxies]
            url = f"http://{front.host}:{front.port}/v1/responses"
            async with aiohttp.ClientSession() as http:
                for route in routes:
                    async with http.post(url, json=_body(_meta(route))) as response:
                        assert response.status == 200, await response.text()
                assert [r.calls for r in routes] == [1, 1]
                # Route of proxy 0 with the secret of proxy 1: proxy 1 gets it and knows no
                # such route (404); proxy 0 never sees it.
                crossed = {
                    **_meta(routes[0]),
                    "vf_nemogym_secret": proxies[1].secret,
                }
                async with http.post(url, json=_body(crossed)) as response:
                    assert response.status == 404
                assert [r.calls for r in routes] == [1, 1]
                for tag in (
                    {},
                    {
                        **_meta(routes[0]),
                        "vf_nemogym_secret": "wrong",
                    },
                ):
                    async with http.post(url, json=_body(tag)) as response:
                        assert response.status == 401
                await proxies[1].stop()  # its process "died" before its lease was noticed
                async with http.post(url, json=_body(_meta(routes[1]))) as response:
                    assert response.status == 410
                    assert "is gone" in (await response.json())["error"]["message"]
            assert front.calls == 4  # 2 ok + the crossed one + the gone one
        finally:
            for proxy in proxies:
                await proxy.stop()
            await front.stop()


async def test_front_forwards_rollout_prefixed_calls() -> None:
    """NeMo Gym 0.7 with observability on calls `/ng-rollout/<id>/v1/responses`: on a shared
    stack the front is the policy model, so it must pass such calls on, path unchanged."""
    front = FrontForwarder()
    await front.start()
    async with ScriptedPolicy() as policy, NeMoGymModelProxy() as proxy:
        front.add(FrontUser(1, proxy.url, secret_digest(proxy.secret)))
        try:
            route = proxy.open_route(policy.base_url, "bearer")
            url = f"http://{front.host}:{front.port}/ng-rollout/{route.rollout_id}/v1/responses"
            async with (
                aiohttp.ClientSession() as http,
                http.post(url, json=_body(_meta(route))) as response,
            ):
                assert response.status == 200, await response.text()
            assert route.calls == 1 and proxy.rollout_path_calls == 1
        finally:
            await front.stop()


async def test_front_routes_rollout_paths_by_their_credential_before_reading_bodies() -> None:
    """A coding-agent CLI's call carries nothing but its rollout id in the path: the front picks
    the proxy whose secret made that id's credential, and refuses a forged or foreign one
    before reading its body (the forger's gigabyte is never read)."""
    front = FrontForwarder()
    await front.start()
    async with ScriptedPolicy() as policy, NeMoGymModelProxy() as a, NeMoGymModelProxy() as b:
        for pid, proxy in enumerate((a, b)):
            front.add(FrontUser(pid, proxy.url, secret_digest(proxy.secret)))
        try:
            routes = [p.open_route(policy.base_url, "bearer") for p in (a, b)]
            base = f"http://{front.host}:{front.port}/ng-rollout"
            async with aiohttp.ClientSession() as http:
                for route in routes:
                    body = {"model": "m", "input": "hi"}  # no routing metadata at all
                    url = f"{base}/{route.rollout_id}/v1/responses"
                    async with http.post(url, json=body) as response:
                        assert response.status == 200, await response.text()
                assert [r.calls for r in routes] == [1, 1]  # each reached its own proxy
            forged = f"{routes[0].id}.{'0' * 32}"
            for path_id in (routes[0].id, forged, "x"):
                reader, writer = await asyncio.open_connection(front.host, front.port)
                try:
                    writer.write(
                        f"POST /ng-rollout/{path_id}/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                        f"Content-Type: application/json\r\nContent-Length: {10**9}\r\n\r\n"
                        "{".encode()
                    )
                    await writer.drain()
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                    assert head.startswith(b"HTTP/1.1 401"), (path_id, head)
                finally:
                    writer.close()
            assert [r.calls for r in routes] == [1, 1] and front.calls == 2
        finally:
            await front.stop()


def _meta(route: Route) -> dict[str, str]:
    """The routing metadata that sends a body to `route` (as a tagged row carries it)."""
    return route_metadata(route.id, route.proxy_secret)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:1@evil.example.com:8080",
        "http://localhost:8000",
        "http://[::1]:8000",
        "http://127.0.0.1:8000/elsewhere",
        "http://127.0.0.1:8000?x=1",
        "https://127.0.0.1:8000",
        "http://127.0.0.1",
        "http://127.0.0.1:notaport",
    ],
)
def test_a_user_proxy_must_be_plainly_on_loopback(url: str):
    """L1: the front forwards only to `http://127.0.0.1:<port>` (userinfo, other hosts, paths
    refused), so a registered user can never point it off the machine."""
    from verifiers_nemogym.shared.host import _loopback_url

    with pytest.raises(ValueError, match=re.escape("is not http://127.0.0.1:<port>")):
        _loopback_url(url)
    assert _loopback_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
