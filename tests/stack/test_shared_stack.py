"""One NeMo Gym stack for many env processes, through verifiers' real env servers.

Everything is real (NeMo Gym, Ray, verifiers' `serve_env` pool and `EnvClient`, the proxies, the
stack host) except the model: the scripted policy. Rows carry a unique tag each, so the policy's
record shows whether any model call reached another rollout's session.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import verifiers.v1 as vf
from helpers.evals import SERVE_ENV_SCRIPT, script, vf_eval_command
from helpers.processes import gone, run_command, run_tag, until
from verifiers.v1.configs.client import EvalClientConfig
from verifiers.v1.serve.client import EnvClient
from verifiers.v1.serve.pool import env_config_data

from benchmarks.common import count_stack_programs
from verifiers_nemogym.errors import StackError
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.net import free_port
from verifiers_nemogym.policies.scripted import ScriptedPolicy
from verifiers_nemogym.shared import client, protocol

ENV = "example_single_tool_call"
GRACE = 8.0
"""Idle grace of the stacks these tests start (seconds)."""
TEARDOWN_S = 45.0
"""Bound on a stack's own teardown after the grace (NeMo Gym shutdown + supervisor sweep)."""


@pytest.fixture
async def policy() -> AsyncIterator[ScriptedPolicy]:
    async with ScriptedPolicy() as p:
        yield p


def tagged_rows(nemo_venv: NeMoGymVenv, path: Path, n: int) -> Path:
    """`n` rows of ENV's example data, each user prompt ending in its own `[#i]` tag."""
    source = Catalog(nemo_venv).env(ENV).dataset().read_text().splitlines()
    rows = [json.loads(line) for line in source if line.strip()]
    with path.open("w") as out:
        for i in range(n):
            row = json.loads(json.dumps(rows[i % len(rows)]))
            for item in row["responses_create_params"]["input"]:
                if item.get("role") == "user":
                    item["content"] = f"{item['content']} [#{i}]"
            out.write(json.dumps(row) + "\n")
    return path


def env_config(rows: Path, grace: float = GRACE) -> dict[str, Any]:
    config = vf.resolve_env_config(
        {
            "taskset": {
                "id": "nemo-gym-env",
                "nemo_env": [ENV],
                "jsonl_path": str(rows),
                "stack_idle_grace": grace,
                "start_timeout": 600,
            }
        }
    )
    return env_config_data(config)


def stack_directory(nemo_venv: NeMoGymVenv) -> Path:
    paths = Catalog(nemo_venv).env(ENV).config_paths
    return client.stack_dir(client.stack_key(nemo_venv, paths))


async def status(nemo_venv: NeMoGymVenv) -> dict[str, Any] | None:
    try:
        return await protocol.request(stack_directory(nemo_venv), {"op": "status"})
    except StackError:
        return None


async def assert_no_stack(nemo_venv: NeMoGymVenv) -> None:
    """These tests count the processes of the stack they start: a stack left running by
    something else (`stack up` elsewhere) would be attached to instead."""
    found = await status(nemo_venv)
    assert found is None, f"a shared stack for {ENV} is already running: {found}"


class ProgramWatch:
    """Samples `count_stack_programs` for a tag and a stack marker until stopped; keeps the
    maxima."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.marker = ""
        self.max_tagged = {"ng_run": 0, "gcs_server": 0}
        self.max_marked = {"ng_run": 0, "gcs_server": 0}
        self.samples = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            for counts, entry in ((self.max_tagged, self.tag), (self.max_marked, self.marker)):
                if entry:
                    for name, n in (await asyncio.to_thread(count_stack_programs, entry)).items():
                        counts[name] = max(counts[name], n)
            self.samples += 1
            await asyncio.sleep(0.5)

    def start(self) -> ProgramWatch:
        """Start sampling; returns the watch."""
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        """Stop sampling; a sampler that failed is a test failure, not a silent zero."""
        assert self._task is not None
        if self._task.done() and not self._task.cancelled():
            self._task.result()
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    def __repr__(self) -> str:
        return f"tagged {self.max_tagged}, marked {self.max_marked}, {self.samples} samples"


async def spawn_server(args: dict[str, Any], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", SERVE_ENV_SCRIPT, json.dumps(args)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # serve_env's graceful teardown stops every env
    try:
        await asyncio.to_thread(proc.wait, 120)
    except subprocess.TimeoutExpired:
        proc.kill()
        await asyncio.to_thread(proc.wait)


async def run_rollouts(
    clients: list[EnvClient], tasks: list[Any], policy: ScriptedPolicy, in_flight: int
) -> list[Any]:
    """Every task once, `in_flight` at a time, spread round-robin over `clients`."""
    gate = asyncio.Semaphore(in_flight)
    client_config = EvalClientConfig(base_url=policy.base_url, api_key_var="SCRIPTED_KEY")

    async def one(i: int) -> Any:
        async with gate:
            return await clients[i % len(clients)].run(
                client_config, "scripted", vf.SamplingConfig(), tasks[i].data.model_dump()
            )

    return await asyncio.gather(*(one(i) for i in range(len(tasks))))


def assert_no_crossing(policy: ScriptedPolicy, n: int) -> None:
    """Each rollout (verifiers session) made its two calls, both for its own row's tag, and
    every tag belongs to exactly one session."""
    by_session: dict[str | None, set[str]] = defaultdict(set)
    calls: dict[str | None, int] = defaultdict(int)
    for call in policy.calls:
        tag = call.prompt.rsplit("[#", 1)[-1]
        by_session[call.session_id].add(tag)
        calls[call.session_id] += 1
    assert None not in by_session
    assert len(by_session) == n, f"{len(by_session)} sessions for {n} rollouts"
    assert all(len(tags) == 1 for tags in by_session.values()), "a call crossed rollouts"
    assert len({next(iter(t)) for t in by_session.values()}) == n
    assert set(calls.values()) == {2}


def load_tasks(rows: Path) -> list[Any]:
    import nemo_gym_env

    return list(nemo_gym_env.load_environment(nemo_env=ENV, jsonl_path=str(rows)).taskset)


async def test_env_server_pools_share_one_stack(
    nemo_venv: NeMoGymVenv,
    policy: ScriptedPolicy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A static pool of 3 workers, then an elastic pool forced to scale up, each running 300
    rollouts at 128 in flight: one `ng_run` and one Ray GCS throughout, reused by the second
    pool within the idle grace; nothing left after the grace."""
    await assert_no_stack(nemo_venv)
    rows = tagged_rows(nemo_venv, tmp_path / "rows.jsonl", 300)
    tasks = load_tasks(rows)
    tag, env = run_tag(SCRIPTED_KEY="unused")
    watch = ProgramWatch(tag).start()
    markers: list[str] = []
    timings: dict[str, float] = {}
    monkeypatch.setenv(*tag.split("="))  # the host this process starts carries the tag too
    # The test holds a lease of its own between the two pools (a pool takes longer than the
    # grace to spawn its workers on a loaded machine), as a persistent `stack up` would.
    paths = Catalog(nemo_venv).env(ENV).config_paths
    holder = await client.attach_or_start(
        nemo_venv,
        paths,
        proxy_url="http://127.0.0.1:9",  # never called: no rollout carries its secret
        proxy_secret=uuid.uuid4().hex,
        idle_timeout=GRACE,
        start_timeout=600,
    )
    try:
        for name, pool in (
            ("static", {"max_workers": 3, "elastic": False}),
            ("elastic", {"max_workers": 3, "elastic": True, "multiplex": 16}),
        ):
            address = f"tcp://127.0.0.1:{free_port()}"
            args = {"address": address, "config_data": env_config(rows), **pool}
            server = await spawn_server(args, env)
            env_client = EnvClient(address)
            try:
                began = time.monotonic()
                policy.calls.clear()
                episodes = await asyncio.wait_for(
                    run_rollouts([env_client], tasks, policy, 128), timeout=900
                )
                timings[name] = time.monotonic() - began
                assert [e.ok for e in episodes] == [True] * len(tasks), [
                    e.errors for e in episodes if not e.ok
                ][:2]
                assert all(t.reward == 1.0 for e in episodes for t in e.traces)
                assert_no_crossing(policy, len(tasks))
                # All 3 workers attach (an elastic pool's late ones may attach after the
                # rollouts are done): 3 workers + the holder.
                await until(lambda: _users_are(nemo_venv, 4), 600, f"{name} pool: 4 users")
                info = await status(nemo_venv)
                assert info is not None and info["users"] == 4, info
                markers.append(info["marker"])
                watch.marker = f"{MARKER_ENV_VAR}={info['marker']}"
                assert len(set(info["user_pids"]) - {os.getpid()}) == 3
            finally:
                await env_client.close()
                await stop_server(server)
        assert markers[0] == markers[1] == holder.marker, "a pool started its own stack"
        await watch.stop()
        assert watch.max_tagged == {"ng_run": 1, "gcs_server": 1}, watch
        assert watch.max_marked == {"ng_run": 1, "gcs_server": 1}, watch
        print(f"\nshared-stack pools: {timings}")
    finally:
        await holder.close()
        if not watch._task or not watch._task.done():
            await watch.stop()
    assert await gone(tag, GRACE + TEARDOWN_S) == []
    assert await gone(f"{MARKER_ENV_VAR}={markers[0]}", 1) == []


@pytest.mark.survey  # CI: an owner SIGKILLed (test_stack.py), a starter SIGKILLed (below)
async def test_sigkilled_workers_leave_the_stack_to_the_others_then_it_stops(
    nemo_venv: NeMoGymVenv, policy: ScriptedPolicy, tmp_path: Path
) -> None:
    """Three single-process env servers start at once (one stack comes up, the others wait on
    the lock and attach); SIGKILL one mid-run and the other two finish on the same stack;
    SIGKILL the other two and the stack is gone within the grace (plus its teardown)."""
    await assert_no_stack(nemo_venv)
    rows = tagged_rows(nemo_venv, tmp_path / "rows.jsonl", 60)
    tasks = load_tasks(rows)
    tag, env = run_tag(SCRIPTED_KEY="unused")
    watch = ProgramWatch(tag).start()
    servers: list[subprocess.Popen[bytes]] = []
    clients: list[EnvClient] = []
    marker = ""
    try:
        for _ in range(3):
            address = f"tcp://127.0.0.1:{free_port()}"
            args = {"max_workers": 1, "address": address, "config_data": env_config(rows)}
            servers.append(await spawn_server(args, env))
            clients.append(EnvClient(address))
        await until(lambda: _users_are(nemo_venv, 3), 900, "three env servers to attach")
        info = await status(nemo_venv)
        assert info is not None
        marker = info["marker"]
        watch.marker = f"{MARKER_ENV_VAR}={marker}"
        victim = asyncio.ensure_future(run_rollouts(clients[:1], tasks[:20], policy, 20))
        survivors = asyncio.ensure_future(run_rollouts(clients[1:], tasks[20:], policy, 40))
        await until(lambda: len(policy.calls) >= 20, 300, "rollouts in flight")
        servers[0].kill()  # SIGKILL: its lease closes with the process
        servers[0].wait()
        victim.cancel()
        await asyncio.gather(victim, return_exceptions=True)
        await until(
            lambda: _users_are(nemo_venv, 2), 30, "the host to see the killed worker's lease close"
        )
        episodes = await asyncio.wait_for(survivors, timeout=600)
        assert [e.ok for e in episodes] == [True] * 40, [e.errors for e in episodes if not e.ok]
        assert all(t.reward == 1.0 for e in episodes for t in e.traces)
        info = await status(nemo_venv)
        assert info is not None and info["marker"] == marker and info["users"] == 2
        await watch.stop()
        assert watch.max_tagged == {"ng_run": 1, "gcs_server": 1}, watch
        for server in servers[1:]:
            server.kill()
            server.wait()
        killed = time.monotonic()
        assert await gone(f"{MARKER_ENV_VAR}={marker}", GRACE + TEARDOWN_S) == []
        gone_after = time.monotonic() - killed
        assert gone_after >= GRACE - 1, "the stack stopped before its idle grace"
        assert await gone(tag, 10) == []
        print(f"\nstack gone {gone_after:.1f} s after the last worker was SIGKILLed")
    finally:
        if watch._task is not None and not watch._task.done():
            await watch.stop()
        for env_client in clients:
            await env_client.close()
        for server in servers:
            if server.poll() is None:
                server.kill()
                server.wait()


async def _users_are(nemo_venv: NeMoGymVenv, n: int) -> bool:
    info = await status(nemo_venv)
    return info is not None and info["users"] == n


def _eval_cmd(policy: ScriptedPolicy, out: Path, *extra: str) -> list[str]:
    return vf_eval_command("scripted", policy.base_url, "SCRIPTED_KEY", 5, 2, 8, out,
                           "--env.taskset.nemo-env", ENV, *extra)  # fmt: skip


def _eval_log(out: Path) -> str:
    (log,) = out.glob("*/logs/latest/eval.log")
    return log.read_text()


def _eval_ok(out: Path, n: int) -> None:
    (traces_file,) = out.glob("*/traces.jsonl")
    episodes = [json.loads(line) for line in traces_file.read_text().splitlines() if line]
    assert len(episodes) == n and all(e["ok"] for e in episodes)


async def test_two_vf_evals_share_a_stack_then_stack_up_vf_eval_stack_down(
    nemo_venv: NeMoGymVenv, policy: ScriptedPolicy, tmp_path: Path
) -> None:
    """Two `vf-eval`s at once start one stack between them; `stack up` (naming the env's config
    file, not the env) within the grace adopts it as persistent; a third `vf-eval` attaches (and
    says how long that took); `stack down` stops it."""
    await assert_no_stack(nemo_venv)
    tag, env = run_tag(SCRIPTED_KEY="unused")
    cli = script("nemo-gym-env")
    watch = ProgramWatch(tag).start()
    marker = ""
    try:
        grace = ("--env.taskset.stack-idle-grace", "60")
        outs = [tmp_path / "a", tmp_path / "b"]
        evals = (run_command(_eval_cmd(policy, o, *grace), env) for o in outs)
        results = await asyncio.gather(*evals)
        for code, output in results:
            assert code == 0, output[-5000:]
        for out in outs:
            _eval_ok(out, 10)
        logs = [_eval_log(o) for o in outs]
        started = [log for log in logs if "NeMo Gym stack ready: started shared" in log]
        attached = [log for log in logs if "attached to shared NeMo Gym stack in" in log]
        assert len(started) == 1 and len(attached) == 1, logs
        assert watch.max_tagged == {"ng_run": 1, "gcs_server": 1}, watch

        # Named by its config file, as a taskset's `config_paths` names one (relative to the
        # NeMo Gym install): the same stack, so `up` adopts it (one ng_run throughout).
        catalog = Catalog(nemo_venv)
        (config,) = catalog.env(ENV).config_paths
        by_path = ["--config-path", str(config.relative_to(catalog.root))]
        code, output = await run_command(
            [cli, "stack", "up", *by_path, "--idle-timeout", "300"], env
        )
        assert code == 0 and "shared stack" in output, output
        info = await status(nemo_venv)
        assert info is not None and info["persistent"] and info["idle_timeout"] == 300
        marker = info["marker"]
        watch.marker = f"{MARKER_ENV_VAR}={marker}"

        code, output = await run_command(_eval_cmd(policy, tmp_path / "c"), env)
        assert code == 0, output[-5000:]
        _eval_ok(tmp_path / "c", 10)
        line = next(x for x in _eval_log(tmp_path / "c").splitlines() if "attached to shared" in x)
        attach_s = float(line.split("stack in ", 1)[1].split(" s", 1)[0])
        assert attach_s < 5, line
        print(f"\nvf-eval attached to the running stack in {attach_s:.3f} s")
        info = await status(nemo_venv)
        assert info is not None and info["marker"] == marker and info["users"] == 0

        code, output = await run_command([cli, "stack", "status", "--json"], env, stdout_only=True)
        assert code == 0 and json.loads(output)[0]["marker"] == marker, output
        code, output = await run_command([cli, "stack", "down", ENV], env)
        assert code == 0 and "stopped shared stack" in output, output
        assert await gone(f"{MARKER_ENV_VAR}={marker}", 10) == []
        assert await status(nemo_venv) is None
        code, output = await run_command([cli, "stack", "down"], env)
        assert code == 1 and "no matching shared NeMo Gym stack" in output, output
        await watch.stop()
        assert watch.max_tagged == {"ng_run": 1, "gcs_server": 1}, watch
        assert await gone(tag, 30) == []
    finally:
        if watch._task is not None and not watch._task.done():
            await watch.stop()
        if await status(nemo_venv) is not None:
            await client.take_down(stack_directory(nemo_venv))


def _host_pids(directory: Path) -> list[int]:
    """The stack host processes of `directory` (`client.host_processes`)."""
    return [pid for d, pid in client.host_processes().items() if d == directory.absolute()]


STARTER = """
import asyncio, json, sys
from pathlib import Path
from verifiers_nemogym.shared import client
from verifiers_nemogym.nemo.venv import ensure_venv
paths = [Path(p) for p in json.loads(sys.argv[1])]
asyncio.run(client.attach_or_start(
    ensure_venv(), paths, proxy_url="http://127.0.0.1:9", proxy_secret="s" * 32,
    idle_timeout=float(sys.argv[2]), start_timeout=600,
))
"""


async def test_starter_sigkilled_mid_start_leaves_its_host_to_the_next_user(
    nemo_venv: NeMoGymVenv,
) -> None:
    """A user SIGKILLed while the host it spawned is still starting the stack: the next user
    waits for that host and leases it (it does not start a second one); exactly one `ng_run`
    throughout, and nothing left after the last user leaves."""
    await assert_no_stack(nemo_venv)
    paths = Catalog(nemo_venv).env(ENV).config_paths
    directory = stack_directory(nemo_venv)
    tag, env = run_tag()
    watch = ProgramWatch(tag).start()
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, json.dumps([str(p) for p in paths]), str(GRACE)], env=env
    )
    held = None
    try:
        await until(lambda: bool(_host_pids(directory)), 120, "a host to spawn")
        (host_pid,) = _host_pids(directory)
        starter.kill()  # SIGKILL: the stack lock drops, the host is not told
        starter.wait()
        assert await status(nemo_venv) is None, "the stack was up before the starter was killed"
        held = await client.attach_or_start(
            nemo_venv,
            paths,
            proxy_url="http://127.0.0.1:9",
            proxy_secret=uuid.uuid4().hex,
            idle_timeout=GRACE,
            start_timeout=600,
        )
        assert (held.host_pid, held.started) == (host_pid, False)
        await until(lambda: _users_are(nemo_venv, 1), 10, "this test as the only user")
        await watch.stop()
        assert watch.max_tagged["ng_run"] == 1, watch
    finally:
        if watch._task is not None and not watch._task.done():
            await watch.stop()
        if starter.poll() is None:
            starter.kill()
            starter.wait()
        if held is not None:
            await held.close()
    assert await gone(tag, GRACE + TEARDOWN_S) == []
