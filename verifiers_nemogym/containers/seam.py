"""`StackSandboxes`: the package's `nemo.sandboxes.SandboxesFactory`, one stack's sandboxes
through whichever provider its configs name (`provider_for`).

`prepare` reads what the configs ask (`sandbox.sandbox_plan`), checks the providers' commands,
then drives the provider contract in order: `check` (fails closed, makes nothing), the servers
run from the stack's folder (`sandbox.shadow_servers`), `sweep`, `prepare`, the door on the
address the provider names, `route`; it writes the config the stack adds after the user's and
logs the provider's `isolation` line. `stop` ends the provider's sandboxes, then the door.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from verifiers_nemogym.containers.door import ModelDoor
from verifiers_nemogym.containers.providers import Provider, opensandbox
from verifiers_nemogym.containers.providers.docker import Docker
from verifiers_nemogym.containers.providers.opensandbox import NAME, OpenSandbox
from verifiers_nemogym.containers.providers.passthrough import PassThrough
from verifiers_nemogym.containers.sandbox import (
    Bounds,
    SandboxPlan,
    check_providers,
    sandbox_plan,
    shadow_servers,
)
from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.nemo.catalog import merge_configs
from verifiers_nemogym.nemo.release import features
from verifiers_nemogym.nemo.venv import NeMoGymVenv

logger = logging.getLogger(__name__)

CONFIG_NAME = "vf_nemogym_containers.yaml"
"""The file, in the stack's folder, of the config `prepare` writes."""


def provider_for(
    plan: SandboxPlan,
    marker: str,
    log: logging.Logger,
    *,
    builtin: frozenset[str],
    bounds: Bounds | None = None,
) -> Provider:
    """The `Provider` for `plan`: OpenSandbox's (which runs only alone: ConfigError if mixed),
    docker's when a server uses docker (it also fails closed for the other providers beside it),
    else the pass-through for the rest (`builtin`: NeMo Gym's own provider names for the
    runtime's release; any other name is a plug-in's)."""
    if NAME in plan.providers:
        if len(plan.providers) > 1:
            raise ConfigError(
                f"sandbox providers {', '.join(sorted(plan.providers))} on one stack: "
                f"nemo-gym-env runs {NAME!r} only alone (one provider per stack)"
            )
        return OpenSandbox(marker, log)
    if plan.docker is not None:
        return Docker(marker, log, bounds=bounds)
    return PassThrough(marker, log, builtin=builtin, bounds=bounds)


def sandbox_health(plan: SandboxPlan | None) -> Callable[[], Awaitable[str | None]] | None:
    """For a run whose configs ask for `plan`: a probe of its remote sandbox provider (None
    while it serves, else one line naming it), asked where a rollout fails so that its error
    names a provider gone mid-run; None when no provider of `plan` can be asked (docker's
    failures reach NeMo Gym's answer as they are; a passed-through one is not known here)."""
    if plan is None or NAME not in plan.providers:
        return None
    return partial(opensandbox.health, plan.providers[NAME])


class StackSandboxes:
    """What one stack (`marker`) makes for its sandboxes, whose model calls go to `policy_url`
    (see the module contract). `allow_unisolated`: run sandboxes the package cannot isolate;
    `bounds`: the docker containers' bounds (`sandbox.Bounds`); `packages`: requirement lines
    (`sandbox.check_sandbox_packages`) added to the venvs of the servers that start sandboxes,
    e.g. a NeMo Gym plug-in's provider."""

    def __init__(
        self,
        marker: str,
        policy_url: str,
        log: logging.Logger = logger,
        *,
        allow_unisolated: bool = False,
        bounds: Bounds | None = None,
        packages: Sequence[str] = (),
    ) -> None:
        self.marker = marker
        self.packages = tuple(packages)
        self.policy_url = policy_url
        self.log = log
        self.allow_unisolated = allow_unisolated
        self.bounds = bounds or Bounds()
        self.provider: Provider | None = None
        """The stack's provider, once `check` passed (`stop` then ends its sandboxes)."""
        self.door: ModelDoor | None = None

    @property
    def label(self) -> str | None:
        """The docker label on every container and network of the stack (docker only)."""
        return self.provider.label if isinstance(self.provider, Docker) else None

    def supervisor_args(self) -> list[str]:
        stop = self.provider.stop_module if self.provider is not None else None
        return [
            *(["--docker-label", self.label] if self.label else []),
            *(["--sandbox-stop", stop] if stop else []),
        ]

    async def prepare(
        self, merged: list[dict[str, Any]], venv: NeMoGymVenv, workdir: Path
    ) -> Path | None:
        plan = sandbox_plan(merged)
        if plan is None:
            return None
        check_providers(plan)
        builtin = features(venv.nemo_gym_version).sandbox_providers
        provider = provider_for(plan, self.marker, self.log, builtin=builtin, bounds=self.bounds)
        await provider.check(plan, allow_unisolated=self.allow_unisolated)
        self.provider = provider
        self.log.info("servers starting sandboxes: %s", plan.describe())
        shadowed = shadow_servers(
            plan, venv.site_packages, workdir, venv.nemo_gym_version, self.packages
        )
        if shadowed:
            # Names only: a requirement line is the user's text (`check_sandbox_packages`
            # refuses credentials in it, but the stack's log need not repeat it).
            self.log.info(
                "%s run from the stack's folder (%s): what they write stays there, and their "
                "venvs get the sandbox provider's client%s",
                ", ".join(shadowed),
                workdir,
                f" and {len(self.packages)} package(s) of sandbox_packages"
                if self.packages
                else "",
            )
        await provider.sweep()
        prepared = await provider.prepare(plan, workdir)
        door = None
        if prepared.door_host is not None:
            self.door = ModelDoor(prepared.door_host, self.policy_url)
            await self.door.start()
            door = (prepared.door_host, self.door.port)
        config = merge_configs([await provider.route(plan, door, workdir), prepared.config])
        if not isinstance(provider, Docker):  # docker's lines are its own (`Docker._describe`)
            door_line = (
                f"; model calls go to the door {self.door.url}, rollout routes only"
                if self.door is not None
                else ""
            )
            self.log.warning("%s%s", provider.isolation(), door_line)
        path = workdir / CONFIG_NAME
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    async def stop(self) -> None:
        if self.provider is not None:
            try:
                await self.provider.stop()
            except (ConfigError, StackError) as e:  # the rest of the teardown still runs
                self.log.warning(
                    "could not remove the stack's %s sandboxes (a later start does): %s",
                    self.provider.name,
                    e,
                )
        if self.door is not None:
            await self.door.stop()
