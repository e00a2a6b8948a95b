"""Sandbox providers behind one contract (docs/containers.md, "Providers").

A provider module gives a `Provider`: `check` (one-line errors before any rollout), `prepare`
(the config entries the stack adds after the user's configs, and the door's address as the
sandboxes see it), `isolation` (one line: what it can promise), `stop` (removes what the stack
made, through the provider's own API for a remote one; `stop_module` does it again from the
stack's supervisor, whoever ended the stack) and `sweep` (what dead stacks left).
`REMOTE` maps the NeMo Gym provider names that have such a module here; docker's code is still
`containers.docker.StackContainers`' own (it moves behind this contract later), and a provider
in neither runs passed through, unisolated, with a warning.
"""

from __future__ import annotations

import logging
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

    name: str
    stop_module: str | None
    """A module the stack's supervisor runs (`python -I -m <module> --stop <marker>`, in the
    stack's folder) once the stack's servers are gone, also after its owner was SIGKILLed: it
    removes the stack's sandboxes as `stop` does. None: `stop` alone."""

    async def check(self, plan: SandboxPlan, *, allow_unisolated: bool) -> None:
        """A one-line ConfigError/StackError naming the provider for what is missing."""

    async def prepare(self, plan: SandboxPlan, workdir: Path) -> Prepared:
        """The stack's config entries and door address for the provider's sandboxes."""

    def isolation(self) -> str:
        """One line: how the provider's sandboxes are isolated (or that they are not)."""

    async def sweep(self) -> list[str]:
        """Remove what stacks whose processes are all gone left; the markers swept."""

    async def stop(self) -> None:
        """Remove every sandbox of this stack; idempotent."""


def remote_provider(plan: SandboxPlan, marker: str, log: logging.Logger) -> Provider | None:
    """The `Provider` for `plan`'s provider when it has a module here (`REMOTE`), else None.
    ConfigError if a plan mixes such a provider with another one."""
    from verifiers_nemogym.containers.providers.opensandbox import OpenSandbox
    from verifiers_nemogym.errors import ConfigError

    remote = {"opensandbox": OpenSandbox}
    found = sorted(set(plan.providers) & set(remote))
    if not found:
        return None
    if len(plan.providers) > 1:
        raise ConfigError(
            f"sandbox providers {', '.join(sorted(plan.providers))} on one stack: nemo-gym-env "
            f"runs {found[0]!r} only alone (one provider per stack)"
        )
    return remote[found[0]](marker, log)
