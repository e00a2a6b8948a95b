"""Figure 2: rollouts/s with the stack already up, our harness vs a raw `/run` driver.

Three ways to run the same 100 rollouts (5 example rows x 20, 20 in flight), interleaved:
- `ours`: `env.run_episode` (NeMoGymHarness: verifiers' rollout endpoint, the model proxy, the
  agent's `/run`), on the stack `env.serving()` started.
- `raw_proxy`: an aiohttp driver posting the rows to that stack's agent `/run`, each tagged
  with a proxy route straight to the policy (the proxy without verifiers).
- `raw_direct`: the same driver on a second stack whose `policy_model` is the policy itself
  (NeMo Gym alone).
Besides rollouts/s, CPU milliseconds per rollout, per side: `this_process` (the eval machinery
for `ours`: verifiers, its interception server, our harness and proxy; only the aiohttp driver
for the raw ways), `nemo_gym` (the stack's processes) and `policy`. On a CPU-bound machine the
rate ratio cannot beat the CPU ratio, and CPU time is far less noisy than wall time.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import verifiers.v1 as vf
from verifiers.v1.configs.client import EvalClientConfig

from benchmarks.common import ENV, cpu_s, spawn_policy
from benchmarks.native import native_stack
from verifiers_nemogym.nemo.supervisor import processes_with_marker
from verifiers_nemogym.stack_access import PrivateStack

N, IN_FLIGHT = 100, 20


async def _timed(n: int, one: Callable[[int], Awaitable[None]]) -> float:
    """Rollouts/s of `n` calls of `one(i)` with IN_FLIGHT at a time."""
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def gated(i: int) -> None:
        async with gate:
            await one(i)

    began = time.perf_counter()
    await asyncio.gather(*(gated(i) for i in range(n)))
    return n / (time.perf_counter() - began)


Rates = dict[str, list[float]]
CpuMs = dict[str, dict[str, list[float]]]


async def measure(repeats: int) -> tuple[Rates, CpuMs]:
    """Rollouts/s per way and repeat, and CPU ms per rollout per way, part and repeat."""
    import nemo_gym_env

    os.environ.setdefault("SCRIPTED_KEY", "unused")
    rates: Rates = {"ours": [], "raw_proxy": [], "raw_direct": []}
    cpu_ms: CpuMs = {way: {"this_process": [], "nemo_gym": [], "policy": []} for way in rates}
    async with await spawn_policy() as policy:
        env: Any = nemo_gym_env.load_environment(nemo_env=ENV, shared_stack=False)
        tasks = list(env.taskset)
        client = EvalClientConfig(base_url=policy.info["base_url"], api_key_var="SCRIPTED_KEY")
        ctx = vf.ModelContext(model="scripted", client=client)
        taskset = env.taskset
        direct = native_stack(taskset.nemo_venv, taskset.config_paths(), int(policy.info["port"]))
        async with env.serving():
            await direct.start()
            try:
                assert isinstance(env.stack, PrivateStack) and env._proxy is not None
                # The agents themselves, not the /run targets: the raw drivers post to agents.
                proxy, agents = env._proxy, env.stack.process.agents
                http = aiohttp.ClientSession(
                    cookie_jar=aiohttp.DummyCookieJar(),
                    connector=aiohttp.TCPConnector(limit=0),
                    timeout=aiohttp.ClientTimeout(total=600),
                )

                async def ours(i: int) -> None:
                    episode = await env.run_episode(tasks[i % len(tasks)], ctx)
                    if not episode.ok:
                        raise RuntimeError(f"rollout failed: {episode.errors}")

                async def post(url: str, row: dict[str, Any]) -> None:
                    async with http.post(f"{url}/run", json=row) as response:
                        body = await response.json()
                        if response.status != 200 or body.get("reward") != 1.0:
                            raise RuntimeError(f"/run answered {response.status}: {body}")

                async def raw_proxy(i: int) -> None:
                    data = tasks[i % len(tasks)].data
                    async with proxy.route(policy.info["base_url"], "unused") as route:
                        await post(agents[data.agent], route.tag(data.row))

                async def raw_direct(i: int) -> None:
                    data = tasks[i % len(tasks)].data
                    await post(direct.agents[data.agent], data.row)

                ways = {"ours": ours, "raw_proxy": raw_proxy, "raw_direct": raw_direct}
                markers = {"ours": env.stack.marker, "raw_proxy": env.stack.marker}
                markers["raw_direct"] = direct.marker

                def cpu_now(way: str) -> dict[str, float]:
                    stack = processes_with_marker(markers[way])
                    return {
                        "this_process": time.process_time(),
                        "nemo_gym": sum(cpu_s(pid) or 0.0 for pid in stack),
                        "policy": cpu_s(policy.pid) or 0.0,
                    }

                for way in ways.values():  # warm-up: connections, imports, server caches
                    await _timed(IN_FLIGHT, way)
                names = list(ways)
                for r in range(repeats):
                    for name in names[r % 3 :] + names[: r % 3]:  # rotate the order
                        before = cpu_now(name)
                        rates[name].append(await _timed(N, ways[name]))
                        after = cpu_now(name)
                        for part, used in after.items():
                            cpu_ms[name][part].append((used - before[part]) * 1000 / N)
                await http.close()
            finally:
                await direct.stop()
    return rates, cpu_ms
