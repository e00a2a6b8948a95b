"""A stack's containers: what it makes for the servers of its configs that start sandboxes.

Contract: `StackContainers.prepare` checks the provider (docker: its daemon, and resource requests
it would refuse), sweeps what dead stacks left, makes the stack's container network and starts
the door on it, and writes the config that labels, isolates and routes the containers (None
without sandboxes). What it makes is recorded as it is made (`label`, `door`), so `stop()` after
a start that failed halfway removes exactly that.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import yaml

from verifiers_nemogym.containers.docker import (
    ContainerNetwork,
    check_requests,
    daemon,
    sweep_dead_stacks,
)
from verifiers_nemogym.containers.door import ModelDoor
from verifiers_nemogym.containers.sandbox import (
    STACK_LABEL,
    check_providers,
    sandbox_plan,
    shadow_servers,
    stack_config,
)
from verifiers_nemogym.nemo.supervisor import remove_docker_objects
from verifiers_nemogym.nemo.venv import NeMoGymVenv

logger = logging.getLogger(__name__)


class StackContainers:
    """The containers of one stack (module contract), marked `marker`, whose model calls go to
    the policy at `policy_url` (through the door)."""

    def __init__(self, marker: str, policy_url: str, log: logging.Logger = logger) -> None:
        self.marker = marker
        self.policy_url = policy_url
        self.log = log
        self.label: str | None = None
        """Docker label on every container and network of the stack, once it uses docker."""
        self.door: ModelDoor | None = None
        """The door containers reach their rollout's model route through (`containers.door`)."""

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
            config = stack_config(plan, label=None, network=None, door=None, workdir=workdir)
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
            config = stack_config(
                plan,
                label=self.label,
                network=network.name,
                door=(network.gateway, self.door.port),
                workdir=workdir,
            )
        path = workdir / "vf_nemogym_containers.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    async def stop(self) -> None:
        """Remove what `prepare` made; idempotent."""
        if self.label is not None:
            # The stack's supervisor removed them; this covers a start that failed before it ran.
            await asyncio.to_thread(remove_docker_objects, self.label)
        if self.door is not None:
            await self.door.stop()
