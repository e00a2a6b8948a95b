"""Figure 3: what the model proxy adds per call, and its memory over many rollouts.

Client (this process), proxy and upstream are separate processes. Added latency = a percentile
of calls through the proxy minus the same percentile of calls straight to the upstream (the
scripted policy), measured back to back, at 1, 64 and 256 calls in flight. Rate: calls/s through
the proxy at 256 in flight over calls/s of a bare aiohttp server at 256 in flight, with that
bare server as the proxy's upstream (a proxy is two hops; the policy would cap both). Both
figures are also taken for a bare aiohttp forwarder (`benchmarks.servers forwarder`), the least
any aiohttp proxy does: the proxy's cost read against it is what routing adds. Memory:
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
from verifiers_nemogym.bridge.wire import route_metadata

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
        upstream = policy.info["base_url"]
        bare_url = f"{bare.info['url']}/v1"
        async with (
            await spawn("benchmarks.servers", "forwarder", f"{upstream}/responses") as fwd_policy,
            await spawn("benchmarks.servers", "forwarder", f"{bare_url}/responses") as fwd_bare,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
        ):
            secret = proxy.info["secret"]
            proxied_url = f"{proxy.info['url']}/v1/responses"
            body = json.dumps(REQUEST).encode()
            # Latency: the scripted policy as upstream, called directly, through the proxy and
            # through the bare forwarder (the aiohttp floor of any proxy).
            (route_id,) = await proxy.command(f"open {upstream} 1")
            for level in LEVELS:
                n = CALLS[level]
                ways = {
                    "direct": (f"{upstream}/responses", body),
                    "proxy": (proxied_url, _tagged(route_id, secret)),
                }
                if level == 1:
                    ways["forwarder"] = (f"{fwd_policy.info['url']}/v1/responses", body)
                runs = await _compare(session, ways, level, n)
                direct = runs["direct"][0]
                for way in ("proxy", "forwarder"):
                    if way not in runs:
                        continue
                    prefix = "added" if way == "proxy" else "forwarder_added"
                    for q, name in ((0.5, "p50"), (0.99, "p99")):
                        added = percentile(runs[way][0], q) - percentile(direct, q)
                        result[f"{prefix}_{name}_ms_at_{level}"] = added * 1000
                result[f"direct_p50_ms_at_{level}"] = percentile(direct, 0.5) * 1000
                result[f"policy_rps_at_{level}"] = n / runs["direct"][1]
                result[f"proxy_to_policy_rps_at_{level}"] = n / runs["proxy"][1]
            await proxy.command(f"close {route_id}")
            # Rate: the bare server as upstream (so the upstream never limits the proxy),
            # through the proxy and through the bare forwarder vs the bare server alone.
            (route_id,) = await proxy.command(f"open {bare_url} 1")
            n = CALLS[256]
            ways = {
                "bare": (f"{bare_url}/responses", body),
                "proxy": (proxied_url, _tagged(route_id, secret)),
                "forwarder": (f"{fwd_bare.info['url']}/v1/responses", body),
            }
            runs = await _compare(session, ways, 256, n)
            await proxy.command(f"close {route_id}")
            for way, (_, wall) in runs.items():
                result[f"{way}_rps_at_256"] = n / wall
            result["proxy_rps_ratio"] = result["proxy_rps_at_256"] / result["bare_rps_at_256"]
            result["forwarder_rps_ratio"] = (
                result["forwarder_rps_at_256"] / result["bare_rps_at_256"]
            )
        result.update(await _memory(proxy, upstream))
    return result


async def _compare(
    session: aiohttp.ClientSession, ways: dict[str, tuple[str, bytes]], level: int, n: int
) -> dict[str, tuple[list[float], float]]:
    """Warm every way (url, body), then time `n` calls of each, back to back, at `level` in
    flight; latencies and wall time per way."""
    for url, body in ways.values():
        await load(session, url, [body] * level * 2, level)
    return {name: await load(session, url, [body] * n, level) for name, (url, body) in ways.items()}


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
