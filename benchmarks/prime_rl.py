"""prime-rl's path: loading the taskset, and time to the first reward through an env server.

`taskset_load_s`: a new process does what prime-rl's orchestrator does with the taskset
(`vf.load_taskset` of `nemo_env=example_single_tool_call`, then `list`) on an empty NeMo Gym
cache (uv's own cache stays as it is); wall seconds of the whole process, imports included, and
the load alone as the process measured it.

`first_reward_s`: from spawning verifiers' `serve_env` (2 workers, the shared stack, no stack
up, runtime built) to the first rollout scored through `EnvClient`; beside it NeMo Gym's own
path on the same runtime, rows and policy: `ng_run` started to the first `/run` that returns a
reward (`native_first_reward_s`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.common import ENV, bench_runtime, env_with, start_child
from benchmarks.native import native_stack
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.supervisor import die_with_parent
from verifiers_nemogym.net import free_port

LOAD = (
    "import json, sys, time\n"
    "began = time.monotonic()\n"
    "import verifiers.v1 as vf\n"
    "imported = time.monotonic()\n"
    "config = vf.resolve_env_config({'taskset': json.loads(sys.argv[1])})\n"
    "tasks = list(vf.load_taskset(config.taskset))\n"
    "print(json.dumps({'tasks': len(tasks), 'load_s': time.monotonic() - imported}))\n"
)
SERVE = (
    "import json, sys\n"
    "from verifiers.v1.serve.pool import serve_env\n"
    "serve_env(**json.loads(sys.argv[1]))\n"
)


def _taskset(version: str) -> dict[str, Any]:
    return {"id": "nemo-gym-env", "nemo_env": ENV, "nemo_gym_version": version}


async def load_once(version: str) -> dict[str, float]:
    """One taskset load in a new process on an empty NeMo Gym cache."""
    with tempfile.TemporaryDirectory(prefix="vfng-bench-load-") as cache:
        env = env_with(VF_NEMOGYM_CACHE=cache)
        began = time.monotonic()
        proc = await start_child(
            sys.executable, "-c", LOAD, json.dumps(_taskset(version)),
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), 900)
        wall = time.monotonic() - began
        result = json.loads(out.decode().strip().splitlines()[-1])
        assert result["tasks"] == 5, result
        assert not (Path(cache) / "runtimes").exists(), "loading built a runtime"
    return {"taskset_load_s": wall, "taskset_load_in_process_s": result["load_s"]}


async def first_reward_once(version: str, policy_url: str) -> float:
    """Seconds from spawning the env server to the first scored rollout."""
    import verifiers.v1 as vf
    from verifiers.v1.configs.client import EvalClientConfig
    from verifiers.v1.serve.client import EnvClient
    from verifiers.v1.serve.pool import env_config_data

    config = vf.resolve_env_config({"taskset": {**_taskset(version), "stack_idle_grace": 0}})
    task = next(iter(vf.load_taskset(config.taskset)))
    address = f"tcp://127.0.0.1:{free_port()}"
    args = {"address": address, "config_data": env_config_data(config), "max_workers": 2,
            "elastic": False}  # fmt: skip
    began = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, json.dumps(args)],
        env=env_with(SCRIPTED_KEY="unused"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent(os.getpid(), signal.SIGTERM),  # as `start_child`'s children
    )
    client = EnvClient(address)
    try:
        client_config = EvalClientConfig(base_url=policy_url, api_key_var="SCRIPTED_KEY")
        episode = await asyncio.wait_for(
            client.run(client_config, "scripted", vf.SamplingConfig(), task.data.model_dump()),
            900,
        )
        elapsed = time.monotonic() - began
        assert episode.ok and episode.traces[0].reward == 1.0, episode.errors
    finally:
        await client.close()
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, 120)
    return elapsed


async def native_first_reward_once(policy_port: int) -> float:
    """Seconds from `ng_run` started to the first `/run` that returns a reward."""
    runtime = bench_runtime()
    spec = Catalog(runtime).env(ENV)
    row = json.loads(spec.dataset().read_text().splitlines()[0])
    stack = native_stack(runtime, spec.config_paths, policy_port)
    began = time.monotonic()
    try:
        await stack.start()
        url = dict(stack.run_urls)[spec.agent.name]
        async with aiohttp.ClientSession() as http, http.post(f"{url}/run", json=row) as reply:
            result = await reply.json()
        elapsed = time.monotonic() - began
        assert isinstance(result.get("reward"), int | float), result
    finally:
        await stack.stop()
    return elapsed
