"""Figure: nemo-gym-env served by verifiers' env-server pools, on one shared NeMo Gym stack.

Setup (not timed): the scripted policy, then a persistent shared stack for ENV (`warm.bring_up`,
as `nemo-gym-env stack up` does), then four static pools of verifiers' `EnvServerPool` (the
broker `serve_env` runs for 2+ workers; a 1-worker pool is that same broker with one worker,
where `serve_env(max_workers=1)` would serve in the broker's own process): 1, 2 and 4 workers
with `shared_stack=True` and 1 worker with `shared_stack=False` (its own private stack). Each
pool is warmed up with IN_FLIGHT rollouts at once, which the broker's least-busy dispatch spreads
over every worker, so every worker's env is serving before timing starts.

Per repeat, in rotated order: N rollouts (ENV's 5 example rows, cycled) at IN_FLIGHT in flight
through verifiers' `EnvClient` on each pool; rollouts/s from the first request to the last
episode. Every episode must be ok with reward 1. Meanwhile a sampler counts `ng_run` and Ray
`gcs_server` processes of the shared stack and of the shared pools' process trees (one env
entry each): exactly one of each must exist throughout, and the shared pools' trees must hold
no NeMo Gym process. After each repeat: RSS of the shared stack's processes (stack host with
its front forwarder, supervisor, `ng_run`, NeMo Gym servers, Ray), found by the host's env entry
(`VF_NEMOGYM_STACK_HOST=<key>`, inherited by all of them), and of each pool's worker processes.

`front_hop` = rollouts/s of the shared 1-worker pool (NeMo Gym's model calls go to the front
forwarder, then the worker's proxy) over the private 1-worker pool (to the worker's proxy
directly), within each repeat.

Finally, once: a static pool of 2 workers with `shared_stack=False` is warmed up; the RSS of its
two private stacks (supervisor, `ng_run`, servers, Ray: everything in the pool's tree but the
broker and its direct children) and of its workers, and its `ng_run`/`gcs_server` counts.
Everything started is stopped in `finally`; a process left under a pool's entry is an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.configs.client import EvalClientConfig
from verifiers.v1.serve.client import EnvClient
from verifiers.v1.serve.pool import env_config_data

from benchmarks import warm
from benchmarks.common import ENV, count_stack_programs, rss_mb, spawn_policy, start_child
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.supervisor import (
    argv_of,
    descendants,
    processes_with_env,
)
from verifiers_nemogym.nemo.venv import ensure_venv
from verifiers_nemogym.net import free_port
from verifiers_nemogym.shared import client, protocol

N, IN_FLIGHT = 200, 64
SHARED_WORKERS = (1, 2, 4)
TAG_VAR = "VF_NEMOGYM_BENCH_POOL"
"""Set (to a fresh id) in each pool's environment: its broker, workers and anything they start
inherit it, so one scan finds the pool's whole process tree."""
START_S, RUN_S, STOP_S = 900.0, 600.0, 120.0

# A static pool of `workers` (verifiers' broker); SIGTERM ends it as serve_env's does: the broker
# terminates its workers, which stop their envs (leases closed, private stacks stopped).
_SERVE = """\
import asyncio, json, signal, sys
from verifiers.v1.serve.pool import EnvServerPool
def stop(*_):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt
signal.signal(signal.SIGTERM, stop)
a = json.loads(sys.argv[1])
pool = EnvServerPool({"config_data": a["config"]}, a["workers"], a["address"], elastic=False)
try:
    asyncio.run(pool.run())
except KeyboardInterrupt:
    pass
"""


@dataclass
class Pool:
    """One env-server pool process and a client on it."""

    workers: int
    shared_stack: bool
    tag: str
    proc: asyncio.subprocess.Process
    client: EnvClient

    @property
    def name(self) -> str:
        return f"{'shared' if self.shared_stack else 'private'}_{self.workers}"

    def worker_pids(self) -> list[int]:
        """The broker's spawned workers (its other child is multiprocessing's tracker)."""
        return [p for p in _children(self.proc.pid) if "spawn_main" in " ".join(argv_of(p))]

    def stack_pids(self) -> list[int]:
        """Processes of the pool's tree below its workers: the workers' private stacks."""
        top = {self.proc.pid, *_children(self.proc.pid)}
        return [p for p in processes_with_env(self.tag) if p not in top]


async def start_pool(workers: int, shared_stack: bool) -> Pool:
    taskset = {"id": "nemo-gym-env", "nemo_env": [ENV], "shared_stack": shared_stack}
    config = env_config_data(vf.resolve_env_config({"taskset": {**taskset, "start_timeout": 600}}))
    address = f"tcp://127.0.0.1:{free_port()}"
    tag = f"{TAG_VAR}={uuid.uuid4().hex}"
    args = {"config": config, "workers": workers, "address": address}
    proc = await start_child(
        sys.executable, "-c", _SERVE, json.dumps(args),
        env={**os.environ, "SCRIPTED_KEY": "unused", TAG_VAR: tag.split("=", 1)[1]},
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    return Pool(workers, shared_stack, tag, proc, EnvClient(address))


async def stop_pool(pool: Pool) -> None:
    """Stop the pool and wait (bounded) until nothing of its tree is left; a survivor is
    killed, then reported as an error."""
    await pool.client.close()
    if pool.proc.returncode is None:
        pool.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(pool.proc.wait(), STOP_S)
        except TimeoutError:
            pool.proc.kill()
            await pool.proc.wait()
    # A worker SIGKILLed by the broker's join timeout leaves its stack to the supervisor.
    deadline = time.monotonic() + 60
    while (left := processes_with_env(pool.tag)) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    if left:
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        raise RuntimeError(f"pool {pool.name} left processes behind: {left}")


async def run_rollouts(pool: Pool, tasks: list[Any], policy_url: str, n: int) -> float:
    """Rollouts/s of `n` rollouts (tasks cycled) at IN_FLIGHT; raises unless every episode is
    ok with reward 1."""
    client_config = EvalClientConfig(base_url=policy_url, api_key_var="SCRIPTED_KEY")
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(i: int) -> Any:
        async with gate:
            data = tasks[i % len(tasks)].data.model_dump()
            return await pool.client.run(client_config, "scripted", vf.SamplingConfig(), data)

    began = time.perf_counter()
    episodes = await asyncio.gather(*(one(i) for i in range(n)))
    elapsed = time.perf_counter() - began
    bad = [e.errors for e in episodes if not e.ok or any(t.reward != 1.0 for t in e.traces)]
    if bad:
        raise RuntimeError(f"pool {pool.name}: {len(bad)}/{n} rollouts failed: {bad[:2]}")
    return n / elapsed


@dataclass
class ProgramWatch:
    """Samples the largest count of `ng_run` and `gcs_server` processes over `entries`."""

    entries: Callable[[], list[str]]
    most: dict[str, int] = field(default_factory=lambda: {"ng_run": 0, "gcs_server": 0})
    samples: int = 0
    _task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            counts = await asyncio.to_thread(count_stack_programs, *self.entries())
            self.most = {k: max(v, counts[k]) for k, v in self.most.items()}
            self.samples += 1
            await asyncio.sleep(0.5)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> dict[str, int]:
        """Stop sampling; the maxima (a sampler that failed raises here). Idempotent."""
        if self._task is None:
            return {**self.most, "samples": self.samples}
        task, self._task = self._task, None
        if task.done():
            task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return {**self.most, "samples": self.samples}


def total_rss_mb(pids: list[int]) -> float:
    """Summed RSS of `pids` (a process that exited meanwhile counts 0)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, RuntimeError):
            total += rss_mb(pid)
    return total


def rss_by_program(pids: list[int]) -> dict[str, float]:
    """RSS of `pids` summed per program (argv[0]'s name, or a Python process's script or
    module), largest first: where a stack's memory goes."""
    totals: dict[str, float] = {}
    for pid in pids:
        argv = argv_of(pid) or [""]
        name = os.path.basename(argv[0])
        if name.startswith("python"):
            rest = [a for a in argv[1:] if a and not a.startswith("-")]
            name = os.path.basename(rest[0])[:40] if rest else name
        totals[name] = totals.get(name, 0.0) + total_rss_mb([pid])
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def _children(pid: int) -> list[int]:
    return [child for child, parent in descendants(pid).items() if parent == pid]


async def _warm_up(pools: list[Pool], tasks: list[Any], policy_url: str) -> None:
    """IN_FLIGHT rollouts per pool at once: every worker serves some (stack starts included)."""
    runs = (run_rollouts(p, tasks, policy_url, IN_FLIGHT) for p in pools)
    await asyncio.wait_for(asyncio.gather(*runs), START_S)


async def measure(repeats: int) -> dict[str, Any]:
    """Per repeat: `rps` per pool name and `shared_stack_rss_mb`, `worker_rss_mb` per pool;
    once: `programs_shared`, `private_2` (its RSS and programs) and the stack's `users`."""
    import nemo_gym_env

    runtime = ensure_venv()
    tasks = list(nemo_gym_env.load_environment(nemo_env=ENV).taskset)
    key = client.stack_key(runtime, Catalog(runtime).env(ENV).config_paths)
    host_entry = f"{protocol.HOST_ENV_VAR}={key}"
    out: dict[str, Any] = {"rps": {}, "shared_stack_rss_mb": [], "worker_rss_mb": {}}
    pools: list[Pool] = []
    shared_pools: list[Pool] = []
    watch = ProgramWatch(lambda: [host_entry, *(p.tag for p in shared_pools)])
    async with await spawn_policy() as policy:
        url = policy.info["base_url"]
        await warm.bring_up(runtime)
        try:
            for workers in SHARED_WORKERS:
                shared_pools.append(await start_pool(workers, shared_stack=True))
                pools.append(shared_pools[-1])
            watch.start()
            await _warm_up(shared_pools, tasks, url)
            status = await protocol.request(client.stack_dir(key), {"op": "status"})
            attached = {pid for p in shared_pools for pid in p.worker_pids()}
            if len(attached) != sum(SHARED_WORKERS) or attached - set(status["user_pids"]):
                raise RuntimeError(f"not every shared worker attached: {attached} vs {status}")
            out["users"] = status["users"]
            # The private pool's stack starts only now: two stack starts at once overload Ray's
            # fixed node-start timeout on a small machine.
            pools.append(await start_pool(1, shared_stack=False))
            await _warm_up(pools[-1:], tasks, url)
            for r in range(repeats):
                for pool in pools[r % len(pools) :] + pools[: r % len(pools)]:
                    rate = await asyncio.wait_for(run_rollouts(pool, tasks, url, N), RUN_S)
                    out["rps"].setdefault(pool.name, []).append(rate)
                out["shared_stack_rss_mb"].append(total_rss_mb(processes_with_env(host_entry)))
                for pool in pools:
                    rss = total_rss_mb(pool.worker_pids()) / pool.workers
                    out["worker_rss_mb"].setdefault(pool.name, []).append(rss)
            programs = out["programs_shared"] = await watch.stop()
            if (programs["ng_run"], programs["gcs_server"]) != (1, 1):
                raise RuntimeError(f"not one stack for the shared pools: {programs}")
            strays = {p.name: p.stack_pids() for p in shared_pools if p.stack_pids()}
            if strays:
                raise RuntimeError(f"shared pools started NeMo Gym processes: {strays}")
            out["private_1_stack_rss_mb"] = total_rss_mb(pools[-1].stack_pids())
            out["rss_by_program"] = {
                "shared_stack": rss_by_program(processes_with_env(host_entry)),
                "private_1_stack": rss_by_program(pools[-1].stack_pids()),
            }
            while pools:
                await stop_pool(pools.pop())
            try:
                out["private_2"] = await _private_pair(tasks, url)
            except Exception as e:  # two stack starts at once may fail on a loaded machine
                out["private_2"] = {"error": f"{type(e).__name__}: {e}"[-3000:]}
        finally:
            await asyncio.gather(watch.stop(), return_exceptions=True)
            for pool in pools:
                with contextlib.suppress(Exception):  # already failing: keep that error
                    await stop_pool(pool)
            await warm.take_down(runtime)
    return out


async def _private_pair(tasks: list[Any], policy_url: str) -> dict[str, Any]:
    """A 2-worker pool with a private stack per worker: its stacks' RSS, workers' RSS and
    `ng_run`/`gcs_server` counts once both serve."""
    pool = await start_pool(2, shared_stack=False)
    watch = ProgramWatch(lambda: [pool.tag])
    try:
        watch.start()
        await _warm_up([pool], tasks, policy_url)
        result = {
            "stacks_rss_mb": total_rss_mb(pool.stack_pids()),
            "worker_rss_mb": total_rss_mb(pool.worker_pids()) / 2,
        }
        result["programs"] = await watch.stop()
        return result
    finally:
        await asyncio.gather(watch.stop(), return_exceptions=True)
        await stop_pool(pool)
