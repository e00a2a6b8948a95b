"""Sandbox providers behind one contract (docs/containers.md, "Providers").

A provider module gives a `Provider` for one stack: `check` (one-line errors before anything is
made), `sweep` (what dead stacks left), `prepare` (config entries merged after the user's
configs, and the door's address as its sandboxes see it), `route` (the config that routes its
sandboxes' model calls to the door the stack started there, and labels and bounds them),
`isolation` (one line: what it can promise, or what it cannot) and `stop` (removes what the
stack made, through the provider's own API for a remote one). `containers.seam.StackSandboxes`
picks a stack's provider (`seam.provider_for`) and drives it in that order. Docker
(`providers/docker.py`) and OpenSandbox (`providers/opensandbox.py`) have modules here; every
other NeMo Gym provider, the built-in ones and those a NeMo Gym plug-in registers through the
`nemo_gym.sandbox_providers` entry point, runs passed through (`providers/passthrough.py`):
refused unless the user accepts unisolated sandboxes, with one line saying what it cannot
promise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from verifiers_nemogym.containers.sandbox import SandboxPlan

ACCEPT_RISK = "allow_unisolated_containers (--env.taskset.allow-unisolated-containers true)"
"""The option that accepts sandboxes the package cannot isolate: without it such a stack is
refused before it starts (`docker.check_isolation`, `Provider.check`)."""
DOOR_HOST_ENV = "VF_NEMOGYM_DOOR_HOST"
"""The address the door binds for a remote provider's sandboxes (default: docker's default
bridge gateway, where the local OpenSandbox docker runtime puts them)."""


@dataclass
class Prepared:
    """What a provider adds to a stack: config entries (merged after the user's configs) and
    the door's bind address (None: no door; agents keep their model server)."""

    config: dict[str, Any] = field(default_factory=dict)
    door_host: str | None = None


class Provider(Protocol):
    """One sandbox provider for one stack (`marker`); see the module contract."""

    @property
    def name(self) -> str:
        """The NeMo Gym provider name(s) it runs, for messages."""

    async def check(self, plan: SandboxPlan, *, allow_unisolated: bool) -> None:
        """A one-line ConfigError/StackError naming the provider for what is missing, and for
        sandboxes it cannot isolate unless `allow_unisolated`. Makes nothing."""

    async def sweep(self) -> list[str]:
        """Remove what stacks whose processes are all gone left; the markers swept."""

    async def prepare(self, plan: SandboxPlan, workdir: Path) -> Prepared:
        """The stack's config entries and door address for the provider's sandboxes."""

    async def route(
        self, plan: SandboxPlan, door: tuple[str, int] | None, workdir: Path
    ) -> dict[str, Any]:
        """The config that sends the sandboxes' model calls to `door` (host, port; None: no
        door), with whatever labels and bounds the provider applies."""

    def isolation(self) -> str:
        """One line: how the provider's sandboxes are isolated (or that they are not)."""

    async def stop(self) -> None:
        """Remove every sandbox of this stack; idempotent."""
