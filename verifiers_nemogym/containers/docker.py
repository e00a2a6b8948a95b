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
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from verifiers_nemogym.containers.door import ModelDoor
from verifiers_nemogym.containers.sandbox import (
    STACK_LABEL,
    SandboxPlan,
    check_providers,
    sandbox_plan,
    shadow_servers,
    stack_config,
)
from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.nemo.supervisor import alive, argv_of, pids, processes_with_marker
from verifiers_nemogym.nemo.supervisor import remove_docker_objects as remove_objects
from verifiers_nemogym.nemo.venv import NeMoGymVenv

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
    argv = [docker_cli(), *args]
    try:
        out = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        raise StackError(f"`docker {args[0]}` did not answer within {timeout:.0f} s") from None
    if out.returncode != 0:
        lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit status {out.returncode}"
        raise StackError(f"`docker {' '.join(args[:2])}` failed: {reason}")
    return out.stdout


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
            out = subprocess.run(
                [iptables, "-I", "INPUT", *rule], capture_output=True, text=True, check=False
            )
            if out.returncode != 0:
                raise StackError(f"iptables refused the container firewall: {out.stderr.strip()}")
        return True


def _stack_markers() -> set[str]:
    """Markers of stacks on this host with a docker object (container or network)."""
    found: set[str] = set()
    template = f'{{{{.Label "{STACK_LABEL}"}}}}'
    for listing in (["ps", "-a"], ["network", "ls"]):
        out = run_docker(*listing, "--filter", f"label={STACK_LABEL}", "--format", template)
        found.update(line.strip() for line in out.splitlines() if line.strip())
    return found


def _alive(marker: str) -> bool:
    """A stack's supervisor (its marker on the command line) or a process of it still runs, or
    the process that made its network (the stack is starting: no process of it runs yet)."""
    if processes_with_marker(marker):
        return True
    if any(marker in " ".join(argv_of(pid)) for pid in pids()):
        return True
    owners = run_docker(
        "network", "ls", "--filter", f"label={STACK_LABEL}={marker}",
        "--format", f'{{{{.Label "{OWNER_LABEL}"}}}}',
    ).split()  # fmt: skip
    return any(owner.isdigit() and alive(int(owner)) for owner in owners)


def sweep_dead_stacks(log: logging.Logger = logger) -> list[str]:
    """Remove the containers, networks and rules of stacks whose processes are all gone (a
    starter and its supervisor killed together); the markers swept. A stack still starting
    (its network made, no process of it yet) lives through the network's maker
    (`OWNER_LABEL`), so two stacks starting at once keep theirs."""
    swept = []
    for marker in sorted(_stack_markers()):
        if _alive(marker):
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

    def __init__(self, marker: str, policy_url: str, log: logging.Logger = logger) -> None:
        self.marker = marker
        self.policy_url = policy_url
        self.log = log
        self.label: str | None = None  # on every container and network, once it uses docker
        self.door: ModelDoor | None = None

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
        path = workdir / "vf_nemogym_containers.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    async def stop(self) -> None:
        """Remove what `prepare` made; idempotent."""
        if self.label is not None:
            # The stack's supervisor removed them; this covers a start that failed before it ran.
            await asyncio.to_thread(remove_objects, self.label)
        if self.door is not None:
            await self.door.stop()
