"""A stack joins a Ray cluster the user runs (`ray_address`) instead of a private Ray.

The test starts the cluster itself: `ray start --head` from the NeMo Gym runtime's Ray, on
loopback (Ray's loopback-only mode), with token auth and a folder of its own, and stops it in
a `finally`. What it shows: NeMo Gym's head and servers are the cluster's drivers while the
stack runs (and no private Ray starts), rollouts score, the cluster's token given by value
reaches no process's environment or command line, no log and no NeMo Gym config; after the
stack stops the cluster is up with nothing of ours left in it (no live job or actor, no worker
process) and no process of ours left; a wrong or missing token is one line, in seconds. A
cluster whose head runs in a network namespace (another machine) is one line naming this
machine's address and the cluster's nodes, and `stack up` there starts and leaves nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers.evals import model_context, script
from helpers.processes import REPO, SESSION_VAR, gone, run_command, run_tag, until

import nemo_gym_env
from benchmarks.common import count_stack_programs
from benchmarks.netns import A, B, Hosts
from verifiers_nemogym.errors import StackError
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.head import fetch_merged_config
from verifiers_nemogym.nemo.ray_cluster import RayCluster
from verifiers_nemogym.nemo.supervisor import (
    MARKER_ENV_VAR,
    processes_with_env,
    signal_with_env,
)
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.net import free_port
from verifiers_nemogym.policies.scripted import ScriptedPolicy
from verifiers_nemogym.shared import client, protocol
from verifiers_nemogym.shared.client import check_ray
from verifiers_nemogym.stack_access import SharedStack
from verifiers_nemogym.util import cache_root

ENV = "example_single_tool_call"
CLUSTER_VAR = "VF_NEMOGYM_TEST_RAY_CLUSTER"
"""Marks every process of the test's cluster (Ray's children inherit it)."""

# What the cluster's GCS knows, read the way `ray list` would, without joining as a driver.
STATE = """
import asyncio, json, sys
from ray._raylet import GcsClient
from ray.core.generated.gcs_pb2 import ActorTableData, GcsNodeInfo
client = GcsClient(address=sys.argv[1])
nodes = client.get_all_node_info(timeout=10).values()
jobs = client.get_all_job_info(timeout=10).values()
async def all_actors():
    return await client.async_get_all_actor_info(timeout=10)
actors = asyncio.run(all_actors()).values()
print(json.dumps({
    "nodes": [n.node_manager_address for n in nodes if n.state == GcsNodeInfo.ALIVE],
    "jobs": sorted(({"pid": j.driver_pid, "dead": j.is_dead} for j in jobs), key=str),
    "actors": [ActorTableData.ActorState.Name(a.state) for a in actors],
}))
"""


@dataclass
class Cluster:
    address: str
    token: str
    marker: str
    env: dict[str, str]
    """The environment of the cluster's processes (its token file, its folder)."""
    python: Path
    state_script: Path
    on_host: list[str]
    """The command prefix running a command on the cluster's host (empty: this machine)."""

    def state(self) -> dict[str, Any]:
        out = subprocess.run(
            [*self.on_host, str(self.python), "-I", str(self.state_script), self.address],
            env=self.env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))

    def processes(self) -> set[int]:
        return set(processes_with_env(self.marker))


@contextlib.asynccontextmanager
async def ray_head(runtime: NeMoGymVenv, hosts: Hosts | None = None) -> AsyncIterator[Cluster]:
    """A one-node Ray cluster on loopback with token auth, stopped (every process of it) on
    exit. Ray's loopback-only mode (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`) keeps every
    listener on 127.0.0.1 (`--node-ip-address 127.0.0.1` alone is rewritten to the machine's
    address); every port is chosen, none of Ray's fixed defaults. With `hosts`, the cluster
    runs on host A of those namespaces instead, at its address `A`: another machine."""
    on_host, node_ip = (hosts.run("a"), A) if hosts else ([], "127.0.0.1")
    node_flag = ["--node-ip-address", A] if hosts else []
    folder = Path(tempfile.mkdtemp(prefix="vfray-", dir="/tmp"))  # short: Ray's sockets
    token = uuid.uuid4().hex * 2
    (folder / "token").write_text(token)
    (folder / "token").chmod(0o600)
    (folder / "state.py").write_text(STATE)
    marker = f"{CLUSTER_VAR}={uuid.uuid4().hex}"
    env = {
        "PATH": os.environ["PATH"], "HOME": str(folder), CLUSTER_VAR: marker.split("=")[1],
        SESSION_VAR: os.environ[SESSION_VAR], "RAY_TMPDIR": str(folder),
        "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(folder / "token"),
        "RAY_USAGE_STATS_ENABLED": "0",
        # The cluster's choice: no idle workers prestarted for drivers (a 2-core machine).
        "RAY_prestart_worker_first_driver": "0",
    }  # fmt: skip
    if not hosts:
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    head: subprocess.Popen[bytes] | None = None
    try:
        # Ray gives its raylet 30 s to register, which a loaded 2-core machine can miss: the
        # head exits, and is started again (on fresh ports), at most three times.
        for _ in range(3):
            port = free_port()
            cluster = Cluster(
                f"{node_ip}:{port}", token, marker, env, runtime.bin("python"),
                folder / "state.py", on_host,
            )  # fmt: skip
            command = [
                *on_host, str(runtime.bin("ray")), "start", "--head", "--block",
                "--port", str(port), *node_flag,
                "--num-cpus", "1", "--include-dashboard", "false", "--disable-usage-stats",
                "--dashboard-port", str(free_port()),
                "--ray-client-server-port", str(free_port()),
                "--dashboard-agent-listen-port", str(free_port()),
            ]  # fmt: skip
            with open(folder / "ray-start.log", "wb") as log:
                head = subprocess.Popen(
                    command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )

            async def up(head: subprocess.Popen[bytes] = head, cluster: Cluster = cluster) -> bool:
                if head.poll() is not None:
                    return True  # exited: no use waiting
                try:  # the GCS answers before the head's raylet has registered its node
                    return (await asyncio.to_thread(cluster.state))["nodes"] == [node_ip]
                except AssertionError:
                    return False

            await until(up, 120, "the test's Ray head answers with its node alive")
            if head.poll() is None:
                break
            signal_with_env(cluster.processes(), marker, signal.SIGKILL)
            assert await gone(marker, 30) == []
        assert head.poll() is None, (folder / "ray-start.log").read_text()[-3000:]
        yield cluster
    finally:
        try:
            if head is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(head.pid, signal.SIGTERM)  # `ray start --block` stops its own
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(head.wait, 45)  # Ray drains for up to 30 s first
            signal_with_env(processes_with_env(marker), marker, signal.SIGKILL)  # what is left
            if head is not None and head.poll() is None:
                head.kill()
                head.wait()
            assert await gone(marker, 30) == []
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _holds(pid: int, secret: str) -> bool:
    """Whether `pid`'s environment or command line holds `secret`."""
    for name in ("environ", "cmdline"):
        with contextlib.suppress(OSError):
            if secret.encode() in Path(f"/proc/{pid}/{name}").read_bytes():
                return True
    return False


async def test_a_stack_joins_the_users_ray_cluster_and_leaves_nothing_in_it(
    policy: ScriptedPolicy, nemo_venv: NeMoGymVenv, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with ray_head(nemo_venv) as cluster:
        cluster_processes = cluster.processes()
        assert cluster.state()["jobs"] == []
        # The hardest way to hand the token over: its value in the user's environment.
        monkeypatch.setenv("RAY_AUTH_TOKEN", cluster.token)
        monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
        env = nemo_gym_env.load_environment(
            nemo_env=ENV, ray_address=cluster.address, stack_idle_grace=0,
            nemo_gym_version=nemo_venv.nemo_gym_version, python=str(nemo_venv.python),
        )  # fmt: skip
        tasks = list(env.taskset)[:3]
        async with env.serving():
            assert isinstance(env.stack, SharedStack)
            marker = f"{MARKER_ENV_VAR}={env.stack_marker}"
            ours = set(processes_with_env(marker))
            # NeMo Gym started no Ray of its own: one ng_run, no GCS of ours.
            assert count_stack_programs(marker) == {"ng_run": 1, "gcs_server": 0}
            state = cluster.state()
            drivers = {j["pid"] for j in state["jobs"] if not j["dead"]}
            # ng_run and each server are drivers of the user's cluster, and nothing else is.
            assert len(drivers) >= 3 and drivers <= ours, (drivers, ours)
            config = await fetch_merged_config(env.stack.lease.head_url)
            assert config["ray_head_node_address"] == cluster.address
            assert cluster.token not in json.dumps(config)
            folder = env.stack.lease.directory  # the shared stack's: its host's log
            host = processes_with_env(f"{protocol.HOST_ENV_VAR}={folder.name}")
            assert host
            for pid in ours | set(host):
                assert not _holds(pid, cluster.token), pid
            eps = await asyncio.gather(*(env.run_episode(t, model_context(policy)) for t in tasks))
        assert [e.ok for e in eps] == [True] * len(tasks), [e.errors for e in eps if not e.ok][:2]
        assert [t.reward for e in eps for t in e.traces] == [1.0] * len(tasks)
        # The stack stops after its idle grace: nothing of ours is left, here or in the cluster.
        assert await gone(marker) == []
        assert cluster.token not in (folder / protocol.LOG).read_text()
        state = cluster.state()
        assert state["nodes"] == ["127.0.0.1"]  # the cluster is still up
        assert {j["pid"] for j in state["jobs"]} == drivers  # the jobs were ours...
        assert all(j["dead"] for j in state["jobs"])  # ...and ended with our stack
        assert [a for a in state["actors"] if a != "DEAD"] == []
        # No worker the cluster ran for our jobs lingers; its own processes all still run.
        await until(lambda: cluster.processes() == cluster_processes, 30, "the cluster as before")

        # A wrong or missing token: one line, in seconds, before anything starts.
        for environ in ({"RAY_AUTH_TOKEN": "0" * 64}, {"HOME": "/nonexistent"}):
            began = time.monotonic()
            with pytest.raises(StackError) as info:
                await check_ray(nemo_venv, RayCluster.from_environ(cluster.address, environ))
            assert str(info.value) == (
                f"the Ray cluster at {cluster.address} refused our Ray token: give the "
                "cluster's token with RAY_AUTH_TOKEN_PATH (a file) or RAY_AUTH_TOKEN"
            )
            assert time.monotonic() - began < 30
        assert cluster.state()["jobs"] == state["jobs"]  # the checks joined nothing


def with_private_tmp(private_tmp: Path, command: list[str]) -> tuple[list[str], set[Path]]:
    """`command` in a mount namespace whose /tmp is `private_tmp`, so that whatever it leaves in
    /tmp is seen there; and the folders made in `private_tmp` for that.

    What the command runs from and may lie under /tmp (CI's clean clone and its
    `VF_NEMOGYM_CACHE` are made with `mktemp -d`: the project's venv, the NeMo Gym runtime, the
    release's files) is bound back at its own path, on a folder made for it in `private_tmp`."""
    tmp = Path("/tmp").resolve()
    wanted = sorted({p.resolve() for p in (REPO, Path(sys.prefix), cache_root())})
    kept = [p for p in wanted if p.is_relative_to(tmp)]
    kept = [p for p in kept if not any(p != q and p.is_relative_to(q) for q in kept)]
    binds, made = [], set()
    for path in kept:
        assert not private_tmp.resolve().is_relative_to(path), (path, private_tmp)
        mountpoint = private_tmp / path.relative_to(tmp)
        mountpoint.mkdir(parents=True)
        made |= {mountpoint, *(p for p in mountpoint.parents if p.is_relative_to(private_tmp))}
        binds.append(f"mount --bind {shlex.quote(str(path))} {shlex.quote(str(mountpoint))} && ")
    made.discard(private_tmp)
    shell = f'{"".join(binds)}mount --rbind {shlex.quote(str(private_tmp))} /tmp && exec "$@"'
    unshare = ["unshare", "--mount", "--propagation", "private"]
    return [*unshare, "sh", "-c", shell, "sh", *command], made


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
@pytest.mark.survey  # CI: joining a cluster (above)
async def test_a_cluster_this_machine_is_no_node_of_is_one_line_and_starts_nothing(
    nemo_venv: NeMoGymVenv, tmp_path: Path
) -> None:
    """The cluster's head runs on host A (a network namespace), `stack up` on host B: B reaches
    the cluster and holds its token, but no node of it is B. B's /tmp is a folder of the test's
    (a mount namespace), so whatever the command leaves there is seen."""
    hosts = Hosts(f"vfng{uuid.uuid4().hex[:6]}")
    try:
        hosts.create()
        async with ray_head(nemo_venv, hosts) as cluster:
            entry, env = run_tag(RAY_AUTH_TOKEN=cluster.token)  # given by value: a file in /tmp
            env.pop("RAY_AUTH_TOKEN_PATH", None)
            private_tmp = tmp_path / "tmp"
            private_tmp.mkdir(mode=0o1777)
            command, made = with_private_tmp(
                private_tmp,
                [*hosts.run("b"), script("nemo-gym-env"), "stack", "up", ENV,
                 "--ray-address", cluster.address],
            )  # fmt: skip
            began = time.monotonic()
            code, output = await run_command(command, env, timeout=120)
            elapsed = time.monotonic() - began
            assert (code, output.strip().splitlines()[-1]) == (2, (
                f"nemo-gym-env: the Ray cluster at {cluster.address} has no live node at this "
                f"machine's address {B} (its nodes: {A}); join it first "
                f"(`ray start --address={cluster.address}`)"
            )), output[-3000:]  # fmt: skip
            assert elapsed < 60  # `CHECK_TIMEOUT`, and far less in fact
            # Nothing started or left: no process, nothing in /tmp (the check's folder with the
            # token file is gone), no job in the cluster, no host in the stack's cache folder.
            assert processes_with_env(entry) == []
            assert [p for p in private_tmp.rglob("*") if p not in made] == []
            assert cluster.state()["jobs"] == []
            paths = Catalog(nemo_venv).env(ENV).config_paths
            directory = client.stack_dir(
                client.stack_key(nemo_venv, paths, None, RayCluster(cluster.address))
            )
            assert list(directory.iterdir()) == []  # made (checked private) before the check
            directory.rmdir()
    finally:
        hosts.destroy()
