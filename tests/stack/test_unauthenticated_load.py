"""Callers without a credential cannot make our listeners hold memory (issue 30, requirement 1).

A real shared stack with a judge (the stack host serves the front forwarder, NeMo Gym's
`policy_model`, and the judge relay), attached by this process's env (its model proxy): many
concurrent large bodies without a credential, sent by another process that streams them from a
generator, to each of the three listeners. Each is answered 4xx, and the peak RSS growth of the
host process and of this (the env) process, read from /proc (VmHWM, reset first), stays under the
unauthenticated budget plus aiohttp's own buffer of each connection. Then a 48 MB call with the
proxy's secret at its end (where NeMo Gym puts `metadata`) still goes through the front.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import aiohttp
import pytest
import yaml
from helpers.load import unauthenticated_load
from helpers.processes import gone, run_tag

import nemo_gym_env
from verifiers_nemogym.bridge.wire import UNAUTHENTICATED_BUDGET, route_metadata
from verifiers_nemogym.policies.judge import ScriptedJudge
from verifiers_nemogym.policies.scripted import ScriptedPolicy
from verifiers_nemogym.stack_access import SharedStack

CALLERS = 64
"""Concurrent callers per listener (192 connections: 128 to the host, 64 to the env)."""
BODY_MB = 16
MB = 1024 * 1024


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


def _ports(config: object) -> list[int]:
    """Every `port` value anywhere in a parsed config."""
    if isinstance(config, dict):
        found = [config["port"]] if isinstance(config.get("port"), int) else []
        return found + [p for v in config.values() for p in _ports(v)]
    return [p for v in config for p in _ports(v)] if isinstance(config, list) else []


def _listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (its sockets' inodes in /proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


async def test_unauthenticated_large_bodies_to_every_listener_hold_bounded_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tag, _ = run_tag()
    monkeypatch.setenv(*tag.split("=", 1))  # the host and the stack inherit it
    async with ScriptedJudge() as judge, ScriptedPolicy() as policy:
        env = nemo_gym_env.load_environment(
            nemo_env="equivalence_llm_judge",
            judge={"base_url": judge.base_url, "model": "scripted-judge", "api_key_var": ""},
        )
        async with env.serving():
            assert isinstance(env.stack, SharedStack) and env._proxy is not None
            host = env.stack.lease.host_pid
            ports = _listening_ports(host)
            assert len(ports) == 2, ports  # the front and the judge relay
            urls = [f"http://127.0.0.1:{p}/v1/chat/completions" for p in sorted(ports)]
            urls.append(f"{env._proxy.url}/v1/responses")
            pids = {"host": host, "env": os.getpid()}
            for pid in pids.values():  # VmHWM from now on (Linux: clear_refs 5)
                Path(f"/proc/{pid}/clear_refs").write_text("5")
            before = {name: _status_kb(pid, "VmRSS") for name, pid in pids.items()}
            began = time.monotonic()
            statuses = await unauthenticated_load(urls, CALLERS, BODY_MB * MB)
            took = time.monotonic() - began
            peak = {name: _status_kb(pid, "VmHWM") for name, pid in pids.items()}
            calls = env._proxy.calls
            # A caller with the secret: 16 MB through the front (NeMo Gym's `policy_model`).
            async with aiohttp.ClientSession() as http:
                url = f"{env.stack.lease.head_url}/global_config_dict_yaml"
                async with http.get(url) as response:
                    served = yaml.safe_load(json.loads(await response.text()))
                (front,) = set(_ports(served["policy_model"])) & ports
                route = env._proxy.open_route(policy.base_url, "bearer")
                big = "x" * (BODY_MB * MB)
                call = {"model": "m", "input": [{"role": "user", "content": big}],
                        "metadata": route_metadata(route.id, env._proxy.secret)}  # fmt: skip
                url = f"http://127.0.0.1:{front}/v1/responses"
                async with http.post(url, data=json.dumps(call).encode()) as response:
                    admitted = response.status
            host_alive = env.stack.lease.lost.is_set() is False
        assert await gone(tag) == []
    growth = {name: (peak[name] - before[name]) / 1024 for name in pids}
    print(f"peak RSS growth (MB): {growth}; load {took:.0f} s; {sorted(set(map(str, statuses)))}")
    assert statuses == [401] * 3 * CALLERS, statuses
    assert calls == 0 and judge.calls == [] and host_alive
    assert admitted == 200 and len(policy.calls) == 1
    for name, mb in growth.items():  # the host serves two of the listeners, the env one
        assert mb < UNAUTHENTICATED_BUDGET / MB, f"{name} RSS grew {mb:.1f} MB"
