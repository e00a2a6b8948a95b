"""NeMo Gym 0.7's container environments through its `opensandbox` sandbox provider, on the real
chain: prime-rl's env server or vf-eval -> NeMoGymHarness -> NeMo Gym's servers, their
`OpenSandboxProvider` (its shipped `configs/opensandbox.yaml`, the real `opensandbox` SDK from
`nemo-gym[sandbox]`) -> the real `opensandbox-server` 1.1.1 (docker runtime, on loopback) -> a
sandbox container of the hand-made task image, OpenCode inside -> the door on docker's default
bridge -> the model proxy -> the fixer policy (the token server in train mode). The one double
besides the model is OpenSandbox's in-sandbox daemon: the package's stand-in execd
(`containers.opensandbox_execd`, docs/containers.md says what it does not cover).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers.env_servers import EnvServer, load_tasks, train_client
from helpers.evals import check_trained, error_text, vf_eval_command
from helpers.processes import SHARED_STACK_GONE_S, gone, run_tag, until
from helpers.stacks import runtime_flags
from opensandbox_server import OpenSandboxServer
from verifiers.v1.configs.client import EvalClientConfig

from verifiers_nemogym.containers import images
from verifiers_nemogym.containers.docker import run_docker
from verifiers_nemogym.containers.kit import TaskKit, make_tasks
from verifiers_nemogym.containers.providers.opensandbox import (
    STACK_KEY,
    STOP_FILE,
    OpenSandbox,
    stop_record,
)
from verifiers_nemogym.containers.sandbox import PROVIDER_CONFIG
from verifiers_nemogym.containers.seam import StackSandboxes
from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.nemo import supervisor
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR, env_value, processes_with_env
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.policies.fixer import FixerPolicy, FixTask
from verifiers_nemogym.policies.token_server import TokenServer, packaged_tokenizer

OPENSANDBOX_CONFIG = PROVIDER_CONFIG.format(name="opensandbox")


ENVS = ("swebench_pro", "terminal_bench_2_1")


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> TaskKit:
    return make_tasks(tmp_path_factory.mktemp("kit"), envs=ENVS)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenSandboxServer]:
    """The real server on loopback with the stand-in execd image; afterwards no sandbox is left
    (its list API) and no container of one (docker), and the server process is gone."""
    running = OpenSandboxServer(images.execd_image(), tmp_path_factory.mktemp("opensandbox"))
    running.start()
    try:
        yield running
        left = running.sandboxes()
    finally:
        running.stop()
    assert left == []
    assert sandbox_containers() == []


def sandbox_containers(marker: str | None = None) -> list[str]:
    """Docker containers of sandboxes made for one stack (`marker`) or for any of ours."""
    label = STACK_KEY if marker is None else f"{STACK_KEY}={marker}"
    return run_docker("ps", "-aq", "--filter", f"label={label}").split()


def provider_env(server: OpenSandboxServer, **extra: str) -> dict[str, str]:
    """What NeMo Gym's shipped opensandbox.yaml reads."""
    return {"OPENSANDBOX_DOMAIN": server.url, "OPENSANDBOX_API_KEY": server.key, **extra}


def cases(kit: TaskKit, chosen: list[tuple[str, bool]], path: Path) -> list[FixTask]:
    """One row per case (`(env, right)`), its problem tagged with the case index (so the fixer
    tells rollouts apart), naming NeMo Gym's paired agent, written to `path`; the fixer's table
    in the same order."""
    table, lines = [], []
    for i, (env, _) in enumerate(chosen):
        task = kit.task(env)
        row = task.rows.read_text().splitlines()[0]
        tagged = f"{task.fix.key} (case {i})"
        text = row.replace(json.dumps(task.fix.key)[1:-1], json.dumps(tagged)[1:-1])
        assert text != row
        data = json.loads(text)
        data["agent_ref"] = {"type": "responses_api_agents", "name": task.agent}
        lines.append(json.dumps(data))
        table.append(replace(task.fix, key=tagged, name=f"{task.fix.name}-{i}"))
    path.write_text("\n".join(lines) + "\n")
    return table


def config_paths(kit: TaskKit, envs: tuple[str, ...] = ENVS) -> list[str]:
    """The environments' pairings, NeMo Gym's shipped opensandbox provider config, the kit's
    overrides: as a NeMo Gym user composes them."""
    tasks = [kit.task(env) for env in envs]
    return [
        *(p for t in tasks for p in t.config_paths),
        OPENSANDBOX_CONFIG,
        *(str(t.override) for t in tasks),
    ]


def one_worker_each(kit: TaskKit, envs: tuple[str, ...], path: Path) -> str:
    """A config giving each agent of `envs` one uvicorn worker (NeMo Gym's pairing asks for 4):
    uvicorn kills a worker that is not up within 5 s, and on a loaded 2-core machine importing
    the sandbox clients (opensandbox, daytona, e2b, boto3) takes longer, so the workers were
    restarted for ever. Its path."""
    path.write_text(
        "".join(
            f"{kit.task(env).agent}:\n  responses_api_agents:\n    opencode_sandboxed_agent:\n"
            "      num_workers: 1\n"
            for env in envs
        )
    )
    return str(path)


def stack_sandboxes(server: OpenSandboxServer, marker: str) -> set[str]:
    """Ids of the sandboxes the server lists for stack `marker`."""
    return {
        s["id"] for s in server.sandboxes() if (s.get("metadata") or {}).get(STACK_KEY) == marker
    }


def stack_marker(tag: str) -> str | None:
    """The marker of the stack a process tagged `tag` (a test's `run_tag`) runs, if any yet."""
    for pid in processes_with_env(tag):
        if marker := env_value(pid, MARKER_ENV_VAR):
            return marker
    return None


@pytest.mark.timeout(2400)  # a stack start, OpenCode and the grading in sandboxes, a server stop
async def test_opensandbox_through_the_env_server_eval_train_and_its_server_going_down(
    nemo_venv_07: NeMoGymVenv, kit: TaskKit, server: OpenSandboxServer, tmp_path: Path
) -> None:
    """prime-rl's split (tasks loaded in one process, rollouts on an env server of its own) on
    one shared stack of swebench_pro and terminal_bench_2_1, OpenCode in OpenSandbox sandboxes:
    - eval: three at once, NeMo Gym's reward 1.0 for each environment's right fix and 0.0 for
      swebench_pro's useless edit, every model call from a sandbox through the door on its
      rollout's route;
    - train: verifiers' train client, token ids on every call made from the sandbox;
    - the OpenSandbox server killed mid-rollout: that rollout is an error naming the provider,
      never a reward; the server back, the stack's stop deletes what was left.
    Afterwards the server lists no sandbox, docker has no container of one, and no process of
    the run is left."""
    chosen = [(env, True) for env in ENVS] + [("swebench_pro", False), ("swebench_pro", True)]
    table = cases(kit, chosen, tmp_path / "rows.jsonl")
    table[-1] = replace(table[-1], fix="sleep 600")  # the rollout the server's stop catches
    workers = one_worker_each(kit, ENVS, tmp_path / "workers.yaml")
    # One retry of a failed sandbox operation, not the shipped five (1 + 2 + 4 + 8 + 16 s of
    # back-off): the killed server's rollout ends sooner, and nothing else here fails one.
    retries = tmp_path / "retries.yaml"
    retries.write_text("sandbox:\n  opensandbox:\n    operations:\n      retries: 1\n")
    tag, env = run_tag(FIXER_KEY="x", VF_NEMOGYM_TEST_NO_KEY="x", **provider_env(server))
    taskset = {
        "id": "nemo-gym-env",
        "config_paths": [*config_paths(kit), workers, str(retries)],
        "jsonl_path": str(tmp_path / "rows.jsonl"),
        "allow_unisolated_containers": True,  # no egress image here
        "nemo_gym_version": nemo_venv_07.nemo_gym_version,
        "python": str(nemo_venv_07.python),
        "allow_python_below_floor": nemo_venv_07.below_floor,
        "start_timeout": 900,
    }
    tasks = await load_tasks(sys.executable, taskset, env)
    assert len(tasks) == len(chosen)
    wrong = frozenset(i for i, (_, right) in enumerate(chosen) if not right)
    graded, sleeping = tasks[:3], tasks[3]
    envs = EnvServer(sys.executable, taskset, env, tmp_path / "env-server.log")
    try:
        async with FixerPolicy(tasks=table, wrong=wrong) as policy:
            client = EvalClientConfig(base_url=policy.base_url, api_key_var="FIXER_KEY")
            episodes = await asyncio.wait_for(envs.run(client, "fixer", graded), 1500)
            for i, episode in enumerate(episodes):
                assert episode.ok, (chosen[i], error_text(episode))
                (trace,) = episode.traces
                assert trace.reward == (1.0 if chosen[i][1] else 0.0), (chosen[i], trace.info)
            assert {call.task for call in policy.log if call.step == "fix"} == set(range(3))
            sessions = {call.session_id for call in policy.log}
            assert len(sessions) == 3  # each rollout on its own route

            async with TokenServer(packaged_tokenizer()) as tokens:
                train = train_client(tokens.base_url, "VF_NEMOGYM_TEST_NO_KEY")
                (trained,) = await asyncio.wait_for(envs.run(train, "tokens", tasks[:1]), 900)
            check_trained(trained)

            marker = await until(lambda: stack_marker(tag), 30, "the stack's marker")
            rollout = asyncio.ensure_future(envs.run(client, "fixer", [sleeping]))
            await until(lambda: any(c.task == 3 and c.step == "fix" for c in policy.log), 600,
                        "the sleeping rollout's command")  # fmt: skip
            # NeMo Gym deletes a finished rollout's sandboxes as it ends: one left, this one's.
            await until(lambda: len(stack_sandboxes(server, marker)) == 1, 30, "one sandbox")
            server.kill()
            try:
                (down,) = await asyncio.wait_for(rollout, 600)
            finally:
                server.start()
        assert not down.ok and all(t.reward is None or "nemo_gym" not in t.rewards
                                   for t in down.traces), down.traces  # fmt: skip
        assert error_text(down).startswith(
            f"harness 'nemo-gym-env': AgentRunError: the OpenSandbox server at {server.url} "
            "(NeMo Gym's opensandbox sandbox provider) does not answer"
        ), error_text(down)
    finally:
        await envs.stop()
    assert await gone(tag, SHARED_STACK_GONE_S) == []
    await until(
        lambda: not stack_sandboxes(server, marker) and not sandbox_containers(marker), 60,
        "the stack's sandboxes to go",
    )  # fmt: skip


DEADLINE = 120.0
"""The SIGKILLed vf-eval's `run_timeout`: its first rollout (sandbox, OpenCode, `sleep 600`)
passes it. At a load of 30 one rollout waited over 150 s for OpenCode's first call; CI's load
is 4-7, where this whole test took 240 s with a 180 s deadline (stack start, the second
rollout's command and the kill in the other 60 s), so 120 s leaves the first command a wide
margin."""


@pytest.mark.timeout(2400)  # a stack start, a rollout deadline
async def test_a_deadline_or_sigkill_leaves_no_sandbox(
    nemo_venv_07: NeMoGymVenv,
    kit: TaskKit,
    server: OpenSandboxServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A vf-eval on a private stack, one rollout at a time, its rollouts' sandboxes running the
    model's `sleep 600`: the stack says its sandboxes are unisolated (opted in); its first
    rollout passes the deadline, and that sandbox is gone within 20 s of the second rollout's
    start, the stack still up; then vf-eval is SIGKILLed during the second, and its stack's
    supervisor deletes that sandbox through the server's API. Afterwards no process of it is
    left, the server lists no sandbox of it and docker has no container of it. (Ctrl-C is the
    normal stop, the provider's `stop`, which every other test here ends with; a run of its own
    cost CI a stack start.)"""
    for name, value in provider_env(server).items():
        monkeypatch.setenv(name, value)
    workers = one_worker_each(kit, ("swebench_pro",), tmp_path / "workers.yaml")
    table = cases(kit, [("swebench_pro", True)] * 2, tmp_path / "rows.jsonl")
    async with FixerPolicy(tasks=[replace(t, fix="sleep 600") for t in table]) as policy:
        cmd = vf_eval_command(
            "policy", policy.base_url, "FIXER_KEY", 2, 1, 1, tmp_path / "out",
            "--env.taskset.config-paths",
            json.dumps([*config_paths(kit, ("swebench_pro",)), workers]),
            "--env.taskset.jsonl-path", str(tmp_path / "rows.jsonl"),
            "--env.taskset.shared-stack", "false",
            "--env.taskset.allow-unisolated-containers", "true",  # no egress image here
            "--env.taskset.task.run-timeout", str(DEADLINE),
            *runtime_flags(nemo_venv_07),
        )  # fmt: skip
        tag, environ = run_tag(FIXER_KEY="unused")
        with (tmp_path / "vf-eval.log").open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                *cmd, env=environ, stdout=log, stderr=subprocess.STDOUT
            )
        try:

            def fixing(count: int) -> bool:
                assert proc.returncode is None, f"vf-eval exited: {tmp_path / 'vf-eval.log'}"
                return sum(c.step == "fix" for c in policy.log) >= count

            await until(lambda: fixing(1), 900, "the first rollout's command")
            marker = await until(lambda: stack_marker(tag), 30, "the stack's marker")
            (first,) = await until(lambda: stack_sandboxes(server, marker), 30, "a sandbox")
            await until(lambda: fixing(2), DEADLINE + 600, "the second rollout")
            await until(
                lambda: first not in stack_sandboxes(server, marker), 20,
                "the sandbox of the rollout past its deadline to go",
            )  # fmt: skip
            assert len(stack_sandboxes(server, marker)) == 1
            proc.kill()
            await asyncio.wait_for(proc.wait(), 120)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    logged = "".join(log.read_text() for log in (tmp_path / "out").glob("*/logs/latest/*.log"))
    assert "OpenSandbox sandboxes run UNISOLATED (allow_unisolated_containers)" in logged
    assert await gone(tag) == []
    await until(
        lambda: not stack_sandboxes(server, marker) and not sandbox_containers(marker), 60,
        "the stack's sandboxes to go",
    )  # fmt: skip


def _merged(nemo_venv_07: NeMoGymVenv, kit: TaskKit) -> list[dict[str, Any]]:
    catalog = Catalog(nemo_venv_07)
    paths = config_paths(kit, ("swebench_pro",))
    return [catalog.merged_config(catalog.config_path(p)) for p in paths]


async def _prepare(
    nemo_venv_07: NeMoGymVenv, kit: TaskKit, workdir: Path, marker: str, **options: Any
) -> StackSandboxes:
    options.setdefault("allow_unisolated", True)
    containers = StackSandboxes(marker, "http://127.0.0.1:9", **options)
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        await containers.prepare(_merged(nemo_venv_07, kit), nemo_venv_07, workdir)
    finally:
        await containers.stop()
    return containers


async def test_what_opensandbox_cannot_give_is_one_line_naming_it_before_any_sandbox(
    nemo_venv_07: NeMoGymVenv,
    kit: TaskKit,
    server: OpenSandboxServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stack's container preparation (what runs before any rollout) refuses with one line
    naming the provider: no opt-in to unisolated sandboxes, no API key, a wrong key, no server
    at the domain."""
    for name, value in provider_env(server).items():
        monkeypatch.setenv(name, value)

    async def refusal(**options: Any) -> str:
        with pytest.raises((ConfigError, StackError)) as caught:
            await _prepare(
                nemo_venv_07, kit, tmp_path / uuid.uuid4().hex, uuid.uuid4().hex, **options
            )
        message = str(caught.value)
        assert "\n" not in message and server.key not in message, message
        return message

    assert "allow_unisolated_containers" in await refusal(allow_unisolated=False)
    monkeypatch.delenv("OPENSANDBOX_API_KEY")
    assert "set OPENSANDBOX_API_KEY" in await refusal()
    monkeypatch.setenv("OPENSANDBOX_API_KEY", "not-the-key")
    assert "refused the API key" in await refusal()
    monkeypatch.setenv("OPENSANDBOX_API_KEY", server.key)
    monkeypatch.setenv("OPENSANDBOX_DOMAIN", f"http://127.0.0.1:{server.port + 1}")
    assert "OpenSandbox server at" in await refusal()


async def test_a_start_deletes_the_sandboxes_a_dead_stack_left(
    nemo_venv_07: NeMoGymVenv,
    kit: TaskKit,
    server: OpenSandboxServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sandboxes whose stack has no live process are deleted through the server's API by the
    next stack's start; those of a stack with a live process, and sandboxes without the stack
    metadata, stay."""
    for name, value in provider_env(server).items():
        monkeypatch.setenv(name, value)
    dead, live = uuid.uuid4().hex, uuid.uuid4().hex
    image = kit.task("swebench_pro").image
    made = {m: server.create(image, {STACK_KEY: m}) for m in (dead, live)}
    other = server.create(image, {"owner": "someone-else"})
    keeper = subprocess.Popen(["sleep", "600"], env={**os.environ, MARKER_ENV_VAR: live})
    try:
        await _prepare(nemo_venv_07, kit, tmp_path / "stack", uuid.uuid4().hex)
        ids = {s["id"] for s in server.sandboxes()}
        assert made[dead] not in ids and {made[live], other} <= ids
        assert sandbox_containers(dead) == [] and len(sandbox_containers(live)) == 1
    finally:
        keeper.kill()
        keeper.wait()
        for sandbox in (made[live], other):
            server.call("DELETE", f"/v1/sandboxes/{sandbox}")


OWNER = """
import subprocess, sys, time
subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE)
time.sleep(600)
"""
"""A stack's owner: starts the supervisor (argv) with its stdin a pipe, then waits."""


async def test_the_supervisor_of_a_sigkilled_owner_deletes_its_stacks_sandboxes(
    kit: TaskKit, server: OpenSandboxServer, tmp_path: Path
) -> None:
    """A stack's supervisor (`--sandbox-stop`, what the stack passes for OpenSandbox) whose
    owner is SIGKILLed tears the stack down and then deletes the stack's sandbox through the
    server's API, reading the server from the stack folder's file (the key as an environment
    reference: the key itself is in neither that file nor the stack's log); another stack's
    sandbox stays."""
    marker, neighbour = uuid.uuid4().hex, uuid.uuid4().hex
    image = kit.task("swebench_pro").image
    ours, theirs = (server.create(image, {STACK_KEY: m}) for m in (marker, neighbour))
    connection = {
        "domain": "${oc.env:OPENSANDBOX_DOMAIN}",
        "api_key": "${oc.env:OPENSANDBOX_API_KEY}",
    }
    (tmp_path / STOP_FILE).write_text(json.dumps(stop_record({"connection": connection})))
    log = tmp_path / "ng_run.log"
    argv = [
        sys.executable, "-I", supervisor.__file__, "--marker", marker, "--log", str(log),
        "--cwd", str(tmp_path), "--sandbox-stop", str(OpenSandbox.stop_module),
        "--", "sleep", "600",
    ]  # fmt: skip
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, *argv], env={**os.environ, **provider_env(server)}
    )
    try:
        await until(lambda: processes_with_env(f"{MARKER_ENV_VAR}={marker}"), 60, "the stack")
        owner.kill()
        owner.wait()
        await until(lambda: ours not in {s["id"] for s in server.sandboxes()}, 90, "the delete")
        assert theirs in {s["id"] for s in server.sandboxes()}
        assert sandbox_containers(marker) == []
        await until(lambda: "teardown complete" in log.read_text(), 30, "the teardown")
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        server.call("DELETE", f"/v1/sandboxes/{theirs}")
    assert "removed the stack's sandboxes" in log.read_text()
    for written in (log, tmp_path / STOP_FILE):
        assert server.key not in written.read_text()
