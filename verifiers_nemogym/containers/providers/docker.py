"""NeMo Gym's `docker` sandbox provider behind the provider contract (`containers.providers`).

`check`: a daemon answers, the sandboxes' requests fit it, and the package can isolate them
(`containers.docker.check_isolation`: root, iptables, a local rootful daemon; fails closed).
`sweep`: what dead stacks left on the daemon (`sweep_dead_stacks`). `prepare`: the stack's
internal network, the door on its gateway. `route`: the firewall (the door's port only), the
refusing name server, apt without retries (`sandbox.APT_NO_RETRIES`), and the config that
labels, joins, bounds and routes every docker container of the stack however it names its
provider (`sandbox.stack_config`). `stop`: removes what the stack made (its supervisor does too,
whatever stops it: `label`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from verifiers_nemogym.containers.docker import (
    ContainerNetwork,
    DockerHost,
    check_isolation,
    check_requests,
    daemon,
    origin_labels,
    sweep_dead_stacks,
)
from verifiers_nemogym.containers.names import RefusingNameServer
from verifiers_nemogym.containers.providers import Prepared
from verifiers_nemogym.containers.sandbox import (
    APT_NO_RETRIES,
    APT_NO_RETRIES_TEXT,
    DEFAULT_DISK,
    STACK_LABEL,
    Bounds,
    SandboxPlan,
    docker_creates,
    stack_config,
)
from verifiers_nemogym.nemo.supervisor import remove_docker_objects

logger = logging.getLogger(__name__)

NAME = "docker"


class Docker:
    """The module contract, for the stack of `marker`; `bounds`: the containers' pids,
    capabilities, lifetime (`sandbox.Bounds`), and disk where the daemon can keep one."""

    name = NAME
    stop_module: str | None = None  # its supervisor removes its objects itself (`label`)

    def __init__(
        self, marker: str, log: logging.Logger = logger, *, bounds: Bounds | None = None
    ) -> None:
        self.marker = marker
        self.log = log
        self.bounds = bounds or Bounds()
        self.host: DockerHost | None = None
        self.label: str | None = None
        """`STACK_LABEL=<marker>` on every container and network, once `prepare` made one:
        what the stack's supervisor removes (`--docker-label`)."""
        self.network: ContainerNetwork | None = None
        self.names: RefusingNameServer | None = None
        self.reach = ""

    async def check(self, plan: SandboxPlan, *, allow_unisolated: bool) -> None:
        host = await asyncio.to_thread(daemon)
        check_isolation(plan, host, allow_unisolated, self.log)
        check_requests(plan, host)
        self.host = host

    async def sweep(self) -> list[str]:
        return await asyncio.to_thread(sweep_dead_stacks, self.log)

    async def prepare(self, plan: SandboxPlan, workdir: Path) -> Prepared:
        self.label = f"{STACK_LABEL}={self.marker}"
        self.network = await asyncio.to_thread(ContainerNetwork.create, self.marker)
        return Prepared(door_host=self.network.gateway)

    async def route(
        self, plan: SandboxPlan, door: tuple[str, int] | None, workdir: Path
    ) -> dict[str, Any]:
        assert self.network is not None and door is not None, "prepare() first"
        firewalled = await asyncio.to_thread(self.network.firewall, door[1])
        apt_conf = None
        if firewalled:
            self.names = await self._start_names(self.network.gateway)
            # Nothing off the machine answers a firewalled container: apt's retries only wait.
            apt_conf = workdir / "apt-no-retries.conf"
            apt_conf.write_text(APT_NO_RETRIES_TEXT, encoding="utf-8")
            apt_conf.chmod(0o644)
        self.reach = (
            "the door only (firewall)"
            if firewalled
            else "the door, and whatever the host serves on all its addresses (no firewall)"
        )
        bounds = self.bounds
        if self.host is not None and self.host.disk_quota and bounds.disk is None:
            bounds = replace(bounds, disk=DEFAULT_DISK)
        config = stack_config(
            plan, label=self.label, network=self.network.name, door=door, workdir=workdir,
            labels=origin_labels(), bounds=bounds,
            dns=self.names.host if self.names is not None else None, apt_conf=apt_conf,
        )  # fmt: skip
        self._describe(plan, config, f"http://{door[0]}:{door[1]}")
        return config

    def isolation(self) -> str:
        network = self.network.name if self.network is not None else "(none yet)"
        return (
            f"docker containers on internal network {network} (no traffic between containers), "
            f"reaching on the host {self.reach or 'nothing yet'}"
        )

    def _describe(self, plan: SandboxPlan, config: dict[str, Any], door_url: str) -> None:
        """Log what the docker containers get, read back from `config` (never claimed)."""
        assert self.network is not None and self.host is not None
        network = self.network.name
        creates = docker_creates(plan, config)
        joined = sorted(i for i, c in creates.items() if c.get("network") == network)
        if other := sorted(set(creates) - set(joined)):
            self.log.warning("containers of %s do NOT join the stack's network", ", ".join(other))
        self.log.info(
            "containers of %s join docker network %s (internal, no traffic between "
            "containers); on the host they reach %s: %s, rollout routes only",
            ", ".join(joined), network, self.reach, door_url,
        )  # fmt: skip
        held: dict[str, list[str]] = {}  # one line per distinct set of bounds
        for instance, create in sorted(creates.items()):
            args = [str(a) for a in create.get("extra_run_args") or []]
            disk = next((b for a, b in itertools.pairwise(args) if a == "--storage-opt"), None)
            bounds = (
                f"pids limit {create.get('pids_limit') or 'none'}, "
                f"disk {disk.removeprefix('size=') if disk else 'unbounded'}, dropped capabilities "
                f"{','.join(create.get('cap_drop') or []) or 'none'}, security options "
                f"{','.join(create.get('security_opt') or []) or 'none'}, keepalive "
                f"{create.get('keepalive_cmd')!r}"
                + (" (then removed)" if "--rm" in args else "")
                + (", apt without retries" if any(APT_NO_RETRIES in a for a in args) else "")
            )
            held.setdefault(bounds, []).append(instance)
        for bounds, instances in held.items():
            self.log.info("containers of %s: %s", ", ".join(instances), bounds)
        if not self.host.disk_quota:
            self.log.info(
                "no disk bound on containers: docker's overlay2 stores them on %s, and a "
                "container's disk is bounded (--storage-opt size=) only on xfs with pquota",
                self.host.backing_filesystem or "an unknown filesystem",
            )

    async def _start_names(self, gateway: str) -> RefusingNameServer | None:
        """The refusing name server on `gateway` (None, with a warning, if it cannot bind)."""
        names = RefusingNameServer(gateway)
        try:
            await names.start()
        except OSError as e:
            self.log.warning(
                "no name server for the containers (%s): each lookup they make waits out "
                "its timeouts (~10 s) before failing",
                e,
            )
            return None
        self.log.info("containers' name lookups: refused at once by %s:%d", gateway, names.port)
        return names

    async def stop(self) -> None:
        if self.label is not None:
            # The stack's supervisor removed them; this covers a start that failed before it ran.
            await asyncio.to_thread(remove_docker_objects, self.label)
        if self.names is not None:
            await self.names.stop()
            self.names = None
