"""Figure 3: what the model proxy adds per call, and its memory over many rollouts.

Client (this process), proxy and upstream are separate processes. Added latency = a percentile
of calls through the proxy minus the same percentile of calls straight to the upstream (the
scripted policy), measured back to back, at 1, 64 and 256 calls in flight. Rate: calls/s through
the proxy at 256 in flight over calls/s of a bare aiohttp server at 256 in flight, with that
bare server as the proxy's upstream (a proxy is two hops; the policy would cap both). Memory:
the proxy's RSS after 100 and after 1,000 simulated rollouts (route opened, two model calls,
route closed), as NeMoGymHarness does per rollout.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from typing import Any

import aiohttp

from benchmarks.common import Helper, percentile, spawn, spawn_policy
from verifiers_nemogym.proxy import route_metadata

# One turn of example_single_tool_call as NeMo Gym's simple_agent sends it.
REQUEST: dict[str, Any] = {
    "model": "scripted",
    "input": [
        {"role": "developer", "content": "You are a helpful personal assistant."},
        {"role": "user", "content": "what's it like in sf?"},
    ],
    "tools": [
        {
            "type": "function",
            "name": "get_weather",
            "description": "",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": ""}},
                "required": ["city"],
                "additionalProperties": False,
            },
        }
    ],
}
LEVELS = (1, 64, 256)
CALLS = {1: 400, 64: 3000, 256: 5000}


async def load(
    session: aiohttp.ClientSession, url: str, bodies: list[bytes], in_flight: int
) -> tuple[list[float], float]:
    """POST every body with `in_flight` concurrent workers; latencies (s) and wall time."""
    latencies: list[float] = []
    queue = iter(bodies)

    async def worker() -> None:
        for body in queue:
            began = time.perf_counter()
            async with session.post(
                url, data=body, headers={"Content-Type": "application/json"}
            ) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"{url} answered {response.status}")
            latencies.append(time.perf_counter() - began)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return latencies, time.perf_counter() - began


def _tagged(route_id: str, secret: str) -> bytes:
    body = copy.deepcopy(REQUEST)
    body["metadata"] = route_metadata(route_id, secret)
    return json.dumps(body).encode()


async def measure_once() -> dict[str, Any]:
    """One repeat of every proxy figure, on fresh helper processes."""
    result: dict[str, Any] = {}
    async with (
        await spawn_policy() as policy,
        await spawn("benchmarks.servers", "proxy") as proxy,
        await spawn("benchmarks.servers", "bare") as bare,
    ):
        secret = proxy.info["secret"]
        proxied_url = f"{proxy.info['url']}/v1/responses"
        direct_body = json.dumps(REQUEST).encode()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            # Latency: the scripted policy as upstream, called directly vs through the proxy.
            upstream = policy.info["base_url"]
            (route_id,) = await proxy.command(f"open {upstream} 1")
            proxied_body = _tagged(route_id, secret)
            for level in LEVELS:
                n = CALLS[level]
                direct, proxied = await _pair(
                    session, f"{upstream}/responses", direct_body, proxied_url, proxied_body,
                    level, n,
                )  # fmt: skip
                for q, name in ((0.5, "p50"), (0.99, "p99")):
                    added = percentile(proxied[0], q) - percentile(direct[0], q)
                    result[f"added_{name}_ms_at_{level}"] = added * 1000
                result[f"direct_p50_ms_at_{level}"] = percentile(direct[0], 0.5) * 1000
                result[f"policy_rps_at_{level}"] = n / direct[1]
                result[f"proxy_to_policy_rps_at_{level}"] = n / proxied[1]
            await proxy.command(f"close {route_id}")
            # Rate: the bare server as upstream (so the upstream never limits the proxy),
            # through the proxy vs the bare server alone.
            bare_url = f"{bare.info['url']}/v1"
            (route_id,) = await proxy.command(f"open {bare_url} 1")
            n = CALLS[256]
            bare_run, proxy_run = await _pair(
                session, f"{bare_url}/responses", direct_body, proxied_url,
                _tagged(route_id, secret), 256, n,
            )  # fmt: skip
            await proxy.command(f"close {route_id}")
            result["bare_rps_at_256"] = n / bare_run[1]
            result["proxy_rps_at_256"] = n / proxy_run[1]
            result["proxy_rps_ratio"] = result["proxy_rps_at_256"] / result["bare_rps_at_256"]
        result.update(await _memory(proxy, upstream))
    return result


async def _pair(
    session: aiohttp.ClientSession,
    direct_url: str,
    direct_body: bytes,
    proxied_url: str,
    proxied_body: bytes,
    level: int,
    n: int,
) -> tuple[tuple[list[float], float], tuple[list[float], float]]:
    """Warm both paths, then time `n` direct calls and `n` proxied calls at `level` in flight."""
    await load(session, direct_url, [direct_body] * level * 2, level)
    await load(session, proxied_url, [proxied_body] * level * 2, level)
    direct = await load(session, direct_url, [direct_body] * n, level)
    proxied = await load(session, proxied_url, [proxied_body] * n, level)
    return direct, proxied


async def _memory(proxy: Helper, upstream: str) -> dict[str, float]:
    """Simulated rollouts, 20 at a time: open a route, two model calls, close it."""
    secret = proxy.info["secret"]
    url = f"{proxy.info['url']}/v1/responses"
    readings: dict[str, float] = {"rss_mb_start": await proxy.command("rss")}
    done = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def rollout(route_id: str) -> None:
            body = _tagged(route_id, secret)
            for _ in range(2):
                async with session.post(url, data=body) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"proxy answered {response.status}")

        while done < 1000:
            ids = await proxy.command(f"open {upstream} 20")
            await asyncio.gather(*(rollout(i) for i in ids))
            await proxy.command("close " + " ".join(ids))
            done += len(ids)
            if done == 100:
                readings["rss_mb_after_100"] = await proxy.command("rss")
    readings["rss_mb_after_1000"] = await proxy.command("rss")
    return readings
