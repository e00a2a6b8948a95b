"""The docker daemon, as NeMo Gym's `docker` sandbox provider uses it on a stack of ours.

Checks before a stack starts (`daemon`, `check_requests`, `missing_images`), the stack's internal
network and its firewall (`ContainerNetwork`), the sweep of what dead stacks left
(`sweep_dead_stacks`, run by every stack start) and `StackContainers`, all of that for one stack.
Removal at a stack's stop is its supervisor's (`supervisor.remove_docker_objects`), whatever
stops it (docs/containers.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from verifiers_nemogym.containers.door import ModelDoor
from verifiers_nemogym.containers.providers import ALLOW_UNISOLATED_ENV, Provider, remote_provider
from verifiers_nemogym.containers.sandbox import (
    STACK_LABEL,
    SandboxPlan,
    check_providers,
    sandbox_plan,
    shadow_servers,
    stack_config,
)
from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.nemo.harnesses import merge_configs
from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR, alive, argv_of, environ_of, pids
from verifiers_nemogym.nemo.supervisor import remove_docker_objects as remove_objects
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.util import run_checked

logger = logging.getLogger(__name__)

DOCKER_TIMEOUT = 60.0
"""Seconds one docker command of this module may take."""
NETWORK_PREFIX = "vfng-"
BRIDGE_PREFIX = "vfng"
"""Bridge interface names are at most 15 characters: the prefix and 11 of the marker."""
OWNER_LABEL = "vf-nemogym.owner"
"""On a stack's network: the pid of the process that made it. (A reused pid only keeps a dead
stack's network until a later sweep.)"""


@dataclass(frozen=True)
class DockerHost:
    """What the daemon offers containers."""

    cpus: int
    memory_bytes: int


def docker_cli() -> str:
    """The `docker` command's path; StackError (one line) if it is not on PATH."""
    docker = shutil.which("docker")
    if docker is None:
        raise StackError("no `docker` CLI on PATH (Debian: apt-get install docker.io; dockerd)")
    return docker


def run_docker(*args: str, timeout: float = DOCKER_TIMEOUT) -> str:
    """`docker <args>`'s stdout; a StackError with docker's last error line if it fails."""
    return run_checked([docker_cli(), *args], f"`docker {' '.join(args[:2])}`", timeout)


def daemon() -> DockerHost:
    """The daemon's CPUs and memory; a one-line StackError if there is no daemon answering."""
    try:
        info = json.loads(run_docker("info", "--format", "{{json .}}"))
    except StackError as e:
        raise StackError(
            f"NeMo Gym's docker sandbox provider needs a running docker daemon: {e}"
        ) from None
    if not isinstance(info, dict) or info.get("ServerErrors") or not info.get("NCPU"):
        errors = info.get("ServerErrors") if isinstance(info, dict) else None
        raise StackError(
            "NeMo Gym's docker sandbox provider needs a running docker daemon: "
            f"{'; '.join(map(str, errors or ['`docker info` shows no server']))}"
        )
    return DockerHost(cpus=int(info["NCPU"]), memory_bytes=int(info.get("MemTotal") or 0))


def check_requests(plan: SandboxPlan, host: DockerHost) -> None:
    """ConfigError (one line, the first offending server and key) if a docker sandbox of `plan`
    asks for more CPUs or memory than `host` has and the provider applies the limits."""
    docker = plan.docker
    if docker is None or not (docker.get("create") or {}).get("apply_resource_limits", True):
        return
    fix = (
        "lower it in an override config (--env.taskset.config-paths), or set "
        "sandbox.docker.create.apply_resource_limits: false"
    )
    for server in plan.servers:
        if server.provider != "docker":
            continue
        cpu = server.request("cpu")
        if cpu is not None and cpu > host.cpus:
            raise ConfigError(
                f"{server.instance}: sandbox_config.resources.cpu is {cpu:g}, but the docker "
                f"daemon has {host.cpus} CPUs (docker refuses --cpus above them); {fix}"
            )
        memory = server.request("memory_mib")
        if memory is not None and host.memory_bytes and memory * 2**20 > host.memory_bytes:
            raise ConfigError(
                f"{server.instance}: sandbox_config.resources.memory_mib is {memory:g}, but the "
                f"docker daemon has {host.memory_bytes // 2**20} MiB; {fix}"
            )


def missing_images(images: Iterable[str]) -> list[str]:
    """The images of `images` the daemon does not have (sorted, once each)."""
    missing = []
    for image in sorted(set(images)):
        try:
            run_docker("image", "inspect", "--format", "{{.Id}}", image)
        except StackError:
            missing.append(image)
    return missing


@dataclass(frozen=True)
class ContainerNetwork:
    """A stack's internal docker network (no route off the machine, no traffic between
    containers), labelled with the stack's marker; `firewall(port)` then drops everything a
    container sends to the host but the door's port (False where it cannot: no root or iptables)."""

    name: str
    bridge: str
    gateway: str
    """The host's address on it: where the door listens."""
    label: str

    @classmethod
    def create(cls, marker: str) -> ContainerNetwork:
        """The network for the stack of `marker`; StackError if docker cannot make one."""
        name, bridge = f"{NETWORK_PREFIX}{marker[:12]}", f"{BRIDGE_PREFIX}{marker[:11]}"
        label = f"{STACK_LABEL}={marker}"
        run_docker(
            "network", "create", "--internal", "--label", label,
            "--label", f"{OWNER_LABEL}={os.getpid()}",
            "--opt", f"com.docker.network.bridge.name={bridge}",
            "--opt", "com.docker.network.bridge.enable_icc=false",
            name,
        )  # fmt: skip
        inspected = json.loads(run_docker("network", "inspect", "--format", "{{json .IPAM}}", name))
        gateways = [c.get("Gateway") for c in inspected.get("Config") or [] if c.get("Gateway")]
        if not gateways:
            remove_objects(label)
            raise StackError(f"docker gave the network {name} no gateway address")
        return cls(name=name, bridge=bridge, gateway=str(gateways[0]), label=label)

    def firewall(self, port: int) -> bool:
        """Drop every packet a container sends to the host except TCP to the gateway's `port`
        (iptables INPUT rules commented with the label). False if it cannot (not root, no
        iptables): containers then reach what the host serves on all its addresses."""
        iptables = shutil.which("iptables")
        if iptables is None or os.geteuid() != 0:
            return False
        comment = ["-m", "comment", "--comment", self.label]
        rules = [
            ["-i", self.bridge, *comment, "-j", "DROP"],
            ["-i", self.bridge, "-p", "tcp", "-d", self.gateway, "--dport", str(port),
             *comment, "-j", "ACCEPT"],
        ]  # fmt: skip
        for rule in rules:  # each inserted first: the ACCEPT ends up above the DROP
            run_checked([iptables, "-I", "INPUT", *rule], "iptables (the container firewall)", 60)
        return True


def _stack_markers() -> dict[str, set[int]]:
    """Markers of stacks on this host with a docker object (container or network), each with
    the PIDs that made its networks (`OWNER_LABEL`)."""
    found: dict[str, set[int]] = {}
    stack, owner = (f'{{{{.Label "{label}"}}}}' for label in (STACK_LABEL, OWNER_LABEL))
    for listing, template in ((["ps", "-a"], stack), (["network", "ls"], f"{stack} {owner}")):
        out = run_docker(*listing, "--filter", f"label={STACK_LABEL}", "--format", template)
        for line in out.splitlines():
            marker, _, pid = line.strip().partition(" ")
            if marker:
                found.setdefault(marker, set()).update([int(pid)] if pid.isdigit() else [])
    return found


def _running(markers: Iterable[str]) -> set[str]:
    """Those of `markers` a live process carries: in its initial environment (a process of the
    stack) or on its command line (the stack's supervisor). One pass over /proc."""
    wanted = {marker: f"{MARKER_ENV_VAR}={marker}".encode() for marker in markers}
    found: set[str] = set()
    for pid in pids():
        if not (left := wanted.keys() - found):
            break
        entries, line = set(environ_of(pid)), " ".join(argv_of(pid))
        found.update(m for m in left if wanted[m] in entries or m in line)
    return found


def sweep_dead_stacks(log: logging.Logger = logger) -> list[str]:
    """Remove the containers, networks and rules of stacks whose processes are all gone (a
    starter and its supervisor killed together); the markers swept. A stack still starting
    (its network made, no process of it yet) lives through the network's maker
    (`OWNER_LABEL`), so two stacks starting at once keep theirs."""
    swept = []
    stacks = _stack_markers()
    running = _running(stacks)
    for marker, owners in sorted(stacks.items()):
        if marker in running or any(alive(owner) for owner in owners):
            continue
        left = remove_objects(f"{STACK_LABEL}={marker}")
        log.info(
            "removed the containers and network of a dead stack (%s)%s",
            marker,
            f"; could not remove: {'; '.join(left)}" if left else "",
        )
        swept.append(marker)
    return swept


class StackContainers:
    """What one stack (`marker`) makes for its sandboxes, whose model calls go to `policy_url`:
    `prepare` checks, sweeps, makes the network, starts the door and writes the config that
    labels, isolates and routes its containers; `stop()` removes what it made."""

    def __init__(
        self,
        marker: str,
        policy_url: str,
        log: logging.Logger = logger,
        *,
        allow_unisolated: bool | None = None,
    ) -> None:
        self.marker = marker
        self.policy_url = policy_url
        self.log = log
        self.label: str | None = None  # on every container and network, once it uses docker
        self.door: ModelDoor | None = None
        self.remote: Provider | None = None  # a provider of `containers.providers`, once used
        self.allow_unisolated = (
            os.environ.get(ALLOW_UNISOLATED_ENV) == "1"
            if allow_unisolated is None
            else allow_unisolated
        )

    async def prepare(
        self, merged: list[dict[str, Any]], venv: NeMoGymVenv, workdir: Path
    ) -> Path | None:
        """The config for the sandboxes of `merged` (the stack's merged configs), in `workdir`."""
        plan = sandbox_plan(merged)
        if plan is None:
            return None
        check_providers(plan)
        self.log.info("servers starting sandboxes: %s", plan.describe())
        if shadowed := shadow_servers(plan, venv.site_packages, workdir, venv.nemo_gym_version):
            self.log.info(
                "%s run from the stack's folder (%s): what they write stays there, and their "
                "venvs get the sandbox provider's client",
                ", ".join(shadowed),
                workdir,
            )
        if (remote := remote_provider(plan, self.marker, self.log)) is not None:
            return await self._prepare_remote(remote, plan, workdir)
        if plan.docker is None:
            self.log.warning(
                "sandbox provider(s) %s: nemo-gym-env does not isolate their containers; they "
                "reach what the provider's network allows (docker stacks are isolated)",
                ", ".join(plan.providers),
            )
            name, door = None, None
        else:
            host = await asyncio.to_thread(daemon)
            check_requests(plan, host)
            await asyncio.to_thread(sweep_dead_stacks, self.log)
            self.label = f"{STACK_LABEL}={self.marker}"
            network = await asyncio.to_thread(ContainerNetwork.create, self.marker)
            self.door = ModelDoor(network.gateway, self.policy_url)
            await self.door.start()
            if await asyncio.to_thread(network.firewall, self.door.port):
                reach = "the door only (firewall)"
            else:
                reach = "the door, and whatever the host serves on all its addresses (no root)"
                self.log.warning(
                    "cannot firewall docker network %s (not root or no iptables): its "
                    "containers reach every host service listening on all addresses",
                    network.name,
                )
            self.log.info(
                "containers join docker network %s (internal, no traffic between containers); "
                "on the host they reach %s: %s, rollout routes only",
                network.name,
                reach,
                self.door.url,
            )
            name, door = network.name, (network.gateway, self.door.port)
        config = stack_config(plan, label=self.label, network=name, door=door, workdir=workdir)
        return _write_config(config, workdir)

    async def _prepare_remote(self, remote: Provider, plan: SandboxPlan, workdir: Path) -> Path:
        """`prepare` for a provider of `containers.providers`: its checks, its sweep of dead
        stacks, the door where its sandboxes reach it, its config entries."""
        await remote.check(plan, allow_unisolated=self.allow_unisolated)
        self.remote = remote
        await remote.sweep()
        prepared = await remote.prepare(plan, workdir)
        door = None
        if prepared.door_host is not None:
            self.door = ModelDoor(prepared.door_host, self.policy_url)
            await self.door.start()
            door = (prepared.door_host, self.door.port)
        self.log.warning(
            "%s; model calls go to the door %s, rollout routes only",
            remote.isolation(),
            self.door.url if self.door else "(none)",
        )
        config = stack_config(plan, label=None, network=None, door=door, workdir=workdir)
        return _write_config(merge_configs([config, prepared.config]), workdir)

    async def stop(self) -> None:
        """Remove what `prepare` made; idempotent."""
        if self.remote is not None:
            try:
                await self.remote.stop()
            except (ConfigError, StackError) as e:  # the rest of the teardown still runs
                self.log.warning(
                    "could not remove the stack's %s sandboxes (a later start does): %s",
                    self.remote.name,
                    e,
                )
        if self.label is not None:
            # The stack's supervisor removed them; this covers a start that failed before it ran.
            await asyncio.to_thread(remove_objects, self.label)
        if self.door is not None:
            await self.door.stop()


def _write_config(config: dict[str, Any], workdir: Path) -> Path:
    path = workdir / "vf_nemogym_containers.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
