"""The docker daemon, as NeMo Gym's `docker` sandbox provider uses it on a stack of ours.

Checks before a stack starts (`daemon`, `check_isolation`, `check_requests`, `missing_images`),
the stack's internal network and its firewall (`ContainerNetwork`) and the sweep of what dead
stacks left (`sweep_dead_stacks`, run by every stack start): the parts the docker provider
(`containers/providers/docker.py`) puts behind the provider contract.
Removal at a stack's stop is its supervisor's (`supervisor.remove_docker_objects`), whatever
stops it (docs/containers.md).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from verifiers_nemogym.containers.names import PORT as NAMES_PORT
from verifiers_nemogym.containers.providers import ACCEPT_RISK
from verifiers_nemogym.containers.sandbox import ISOLATED_PROVIDERS, STACK_LABEL, SandboxPlan
from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.nemo.supervisor import (
    MARKER_ENV_VAR,
    alive,
    argv_of,
    container_of,
    environ_of,
    kill_processes_mentioning,
    pids,
    processes_mentioning,
    started,
)
from verifiers_nemogym.nemo.supervisor import remove_docker_objects as remove_objects
from verifiers_nemogym.net import bind_error
from verifiers_nemogym.util import run_checked

logger = logging.getLogger(__name__)

DOCKER_TIMEOUT = 60.0
"""Seconds one docker command of this module may take."""
NETWORK_PREFIX = "vfng-"
BRIDGE_PREFIX = "vfng"
"""Bridge interface names are at most 15 characters: the prefix and 11 of the marker."""
OWNER_LABEL = "vf-nemogym.owner"
"""On a stack's network: the process that made it, `PID:start` (`supervisor.started`: a later
process given the same PID is not it). Networks of older releases carry the PID alone."""
BOOT_LABEL = "vf-nemogym.boot"
"""On a stack's networks and containers: the boot id of the host whose processes own it."""
PIDNS_LABEL = "vf-nemogym.pidns"
"""On a stack's networks and containers: the PID namespace its owners run in. The sweep judges
an object by /proc only from the same boot and PID namespace (`sweep_dead_stacks`)."""


def origin() -> tuple[str, str]:
    """(boot id, PID namespace) of this process: what `BOOT_LABEL` and `PIDNS_LABEL` carry.
    Empty strings where Linux does not say (the sweep then removes nothing of ours)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return "", ""
    return boot, pidns


def origin_labels() -> tuple[str, ...]:
    """`key=value` docker labels naming this process's origin (`origin`)."""
    boot, pidns = origin()
    return f"{BOOT_LABEL}={boot}", f"{PIDNS_LABEL}={pidns}"


@dataclass(frozen=True)
class DockerHost:
    """What the daemon offers containers."""

    cpus: int
    memory_bytes: int
    rootless: bool = False
    backing_filesystem: str = ""
    """What overlay2 stores containers' layers on (`extfs`, `xfs`...): a container's disk can be
    bounded (`--storage-opt size=`) only on xfs mounted with pquota."""
    disk_quota: bool = False
    """overlay2 on xfs with project quotas (`disk_quota_at`): `--storage-opt size=` bounds a
    container's writable layer."""


def disk_quota_at(root: str, mountinfo: str | None = None) -> bool:
    """Whether the folder `root` (docker's data root; this machine's) is on an xfs filesystem
    mounted with project quotas (`pquota`, shown as `prjquota`): the mount whose point is the
    longest prefix of `root` in `mountinfo` (default: this process's /proc/self/mountinfo)."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return False
    best: tuple[int, bool] = (-1, False)
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        point = fields[4]
        fstype, _source, options = [*line.split(" - ", 1)[1].split(), "", "", ""][:3]
        inside = root == point or root.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best[0]:
            quota = fstype == "xfs" and any(
                o in ("prjquota", "pquota", "pqnoenforce") for o in options.split(",")
            )
            best = (len(point), quota)
    return best[1]


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
    status = dict(pair for pair in info.get("DriverStatus") or [] if len(pair) == 2)
    return DockerHost(
        cpus=int(info["NCPU"]),
        memory_bytes=int(info.get("MemTotal") or 0),
        rootless=any("rootless" in str(o) for o in info.get("SecurityOptions") or []),
        backing_filesystem=str(status.get("Backing Filesystem") or ""),
        disk_quota=status.get("Backing Filesystem") == "xfs"
        and disk_quota_at(str(info.get("DockerRootDir") or "")),
    )


def isolation_gaps(plan: SandboxPlan, host: DockerHost | None) -> list[str]:
    """What keeps the package from isolating the containers of `plan` (a phrase each; empty:
    nothing): a provider it has no isolation for (`ISOLATED_PROVIDERS`), and for docker (whose
    daemon is `host`) no root, no iptables, a rootless daemon or a remote one (`DOCKER_HOST`)."""
    gaps = [
        f"the {name!r} sandbox provider's containers (nemo-gym-env isolates docker's only)"
        for name in sorted(plan.providers)
        if name not in ISOLATED_PROVIDERS
    ]
    if plan.docker is None:
        return gaps
    if os.geteuid() != 0:
        gaps.append("root (the docker firewall is iptables rules; this process is not root)")
    if shutil.which("iptables") is None:
        gaps.append("iptables (not on PATH; the docker firewall is iptables rules)")
    if host is not None and host.rootless:
        gaps.append("a rootful docker daemon (this one is rootless)")
    docker_host = os.environ.get("DOCKER_HOST", "")
    if docker_host and not docker_host.startswith("unix://"):
        gaps.append("a local docker daemon (DOCKER_HOST names another machine's)")
    return gaps


def check_isolation(
    plan: SandboxPlan, host: DockerHost | None, allow: bool, log: logging.Logger | None = logger
) -> list[str]:
    """Isolation fails closed: a ConfigError (one line naming what is missing and the option
    that accepts the risk) if the package cannot isolate `plan`'s containers, unless `allow`;
    with `allow` one warning on `log` (None: none) saying what is exposed. Returns the gaps
    (`isolation_gaps`)."""
    gaps = isolation_gaps(plan, host)
    if gaps and not allow:
        raise ConfigError(
            f"cannot isolate the sandbox containers: missing {'; '.join(gaps)}; to run them "
            f"unisolated anyway, accepting that they reach this host's services, set {ACCEPT_RISK}"
        )
    if gaps and log is not None:
        log.warning(
            "sandbox containers run UNISOLATED (opted in with allow_unisolated_containers): "
            "missing %s; they reach every service this host (and the provider's network) "
            "serves them on any address",
            "; ".join(gaps),
        )
    return gaps


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
        origins = [a for o in origin_labels() for a in ("--label", o)]
        run_docker(
            "network", "create", "--internal", "--label", label, *origins,
            "--label", f"{OWNER_LABEL}={os.getpid()}:{started(os.getpid())}",
            "--opt", f"com.docker.network.bridge.name={bridge}",
            "--opt", "com.docker.network.bridge.enable_icc=false",
            name,
        )  # fmt: skip
        inspected = json.loads(run_docker("network", "inspect", "--format", "{{json .IPAM}}", name))
        gateways = [c.get("Gateway") for c in inspected.get("Config") or [] if c.get("Gateway")]
        if not gateways:
            remove_objects(label)
            raise StackError(f"docker gave the network {name} no gateway address")
        gateway = str(gateways[0])
        if bind_error(gateway) is not None:  # not an address of this machine
            remove_objects(label)
            raise StackError(
                f"docker network {name}'s gateway {gateway} is not an address of this machine "
                "(a rootless or remote docker daemon): the door its containers call the model "
                "through cannot listen there"
            )
        return cls(name=name, bridge=bridge, gateway=gateway, label=label)

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
            *self._names_rules(comment),
        ]  # fmt: skip
        for rule in rules:  # each inserted first: the ACCEPT ends up above the DROP
            run_checked([iptables, "-I", "INPUT", *rule], "iptables (the container firewall)", 60)
        return True

    def _names_rules(self, comment: list[str]) -> list[list[str]]:
        """The ACCEPT for the stack's refusing name server (`containers.names`), UDP to the
        gateway's port 53: lookups fail at once instead of timing out."""
        return [
            ["-i", self.bridge, "-p", "udp", "-d", self.gateway, "--dport", str(NAMES_PORT),
             *comment, "-j", "ACCEPT"],
        ]  # fmt: skip


@dataclass
class _Stack:
    """A stack's docker objects as the sweep reads them."""

    owners: set[tuple[int, int | None]]
    """The processes that made its networks (`OWNER_LABEL`): PID and start (None: unknown)."""
    origins: set[tuple[str, str]]
    """(boot id, PID namespace) of each of its objects ("" where a label is missing)."""


def _stack_markers() -> dict[str, _Stack]:
    """Markers of stacks with a docker object (container or network) on the daemon, each with
    its owners and origins."""
    found: dict[str, _Stack] = {}
    stack, boot, pidns, owner = (
        f'{{{{.Label "{label}"}}}}' for label in (STACK_LABEL, BOOT_LABEL, PIDNS_LABEL, OWNER_LABEL)
    )
    common = f"{stack} {boot} {pidns}"
    for listing, template in ((["ps", "-a"], common), (["network", "ls"], f"{common} {owner}")):
        out = run_docker(*listing, "--filter", f"label={STACK_LABEL}", "--format", template)
        for line in out.splitlines():
            marker, boot_id, namespace, pid = [*line.strip().split(" "), "", "", ""][:4]
            if marker:
                entry = found.setdefault(marker, _Stack(set(), set()))
                pid, _, start = pid.partition(":")
                if pid.isdigit():
                    entry.owners.add((int(pid), int(start) if start.isdigit() else None))
                entry.origins.add((boot_id, namespace))
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
    """Remove the containers, networks and rules of stacks proven dead: every object of the
    stack was made from this boot and PID namespace (`BOOT_LABEL`, `PIDNS_LABEL`; so /proc
    here sees all its processes) and its processes are all gone (a starter and its supervisor
    killed together). Another namespace's or host's stack on a shared daemon, and objects
    without those labels, are never touched. A stack still starting (its network made, no
    process of it yet) lives through the network's maker (`OWNER_LABEL`), so two stacks
    starting at once keep theirs. Returns the markers swept."""
    swept = []
    here = origin()
    stacks = {m: s for m, s in _stack_markers().items() if all(here) and s.origins == {here}}
    running = _running(stacks)
    for marker, stack in sorted(stacks.items()):
        if marker in running or any(alive(pid, start) for pid, start in stack.owners):
            continue
        left = remove_objects(f"{STACK_LABEL}={marker}")
        log.info(
            "removed the containers and network of a dead stack (%s)%s",
            marker,
            f"; could not remove: {'; '.join(left)}" if left else "",
        )
        swept.append(marker)
    return swept


def stop_rollout(token: str) -> list[str]:
    """Stop what one rollout left running: SIGKILL the processes whose environment mentions
    `token` (its rollout id: a coding-agent CLI on this host, or run by `docker exec` in a
    container, and their children), and force-remove the containers of a stack of ours
    (`STACK_LABEL`) those processes ran in. Returns the containers removed. A container none of
    whose processes carries the id (between the agent's commands) ends with its lifetime."""
    containers = {c for pid in processes_mentioning(token) if (c := container_of(pid))}
    kill_processes_mentioning(token)
    if not containers:
        return []
    listed = run_docker("ps", "-q", "--no-trunc", "--filter", f"label={STACK_LABEL}")
    ours = sorted(containers & set(listed.split()))
    if ours:
        run_docker("rm", "-f", *ours)
    return ours
