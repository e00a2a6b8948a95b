"""Every NeMo Gym sandbox provider without a module here, passed through by the contract.

NeMo Gym's own (apptainer, enroot, daytona, e2b, ecs_fargate, local, openshell) and any a NeMo
Gym plug-in registers through the `nemo_gym.sandbox_providers` entry point (NeMo Gym's provider
registry, `nemo_gym/sandbox/providers/registry.py`, finds those in the servers' venvs): NeMo
Gym creates and removes their sandboxes itself. The package neither isolates, labels, routes nor
sweeps them, so `check` fails closed (a one-line ConfigError naming the option that accepts the
risk) and `isolation` says in one line what such a stack cannot promise.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from verifiers_nemogym.containers.docker import check_isolation, origin_labels
from verifiers_nemogym.containers.providers import Prepared
from verifiers_nemogym.containers.sandbox import Bounds, SandboxPlan, stack_config

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "nemo_gym.sandbox_providers"
"""The entry point group NeMo Gym 0.7.0's provider registry reads plug-in providers from."""


def kind(name: str, builtin: frozenset[str]) -> str:
    """How `name` reaches NeMo Gym: one of its own providers, or a plug-in's entry point."""
    if name in builtin:
        return "NeMo Gym's own"
    return f"a NeMo Gym plug-in's (entry point group {ENTRY_POINT_GROUP})"


class PassThrough:
    """The module contract for the providers of a plan that has neither docker nor OpenSandbox;
    `builtin`: NeMo Gym's own provider names in the stack's release."""

    def __init__(
        self,
        marker: str,
        log: logging.Logger = logger,
        *,
        builtin: frozenset[str],
        bounds: Bounds | None = None,
    ) -> None:
        self.marker = marker
        self.log = log
        self.builtin = builtin
        self.bounds = bounds or Bounds()
        self.names: list[str] = []

    @property
    def name(self) -> str:
        return ",".join(self.names) or "pass-through"

    stop_module: str | None = None  # NeMo Gym's provider alone removes its sandboxes

    async def check(self, plan: SandboxPlan, *, allow_unisolated: bool) -> None:
        check_isolation(plan, None, allow_unisolated, log=None)  # `isolation` says it once
        self.names = sorted(plan.providers)

    async def sweep(self) -> list[str]:
        return []  # nothing of ours to find: NeMo Gym's provider names its sandboxes

    async def prepare(self, plan: SandboxPlan, workdir: Path) -> Prepared:
        return Prepared()

    async def route(
        self, plan: SandboxPlan, door: tuple[str, int] | None, workdir: Path
    ) -> dict[str, Any]:
        return stack_config(
            plan, label=None, network=None, door=None, workdir=workdir,
            labels=origin_labels(), bounds=self.bounds, dns=None,
        )  # fmt: skip

    def isolation(self) -> str:
        providers = "; ".join(f"{n!r} ({kind(n, self.builtin)})" for n in self.names)
        return (
            f"sandboxes of {providers} run UNISOLATED (allow_unisolated_containers): "
            "nemo-gym-env does not isolate, label, route, bound or sweep them; they reach what "
            "their provider's network allows and go only when NeMo Gym's provider removes them"
        )

    async def stop(self) -> None:
        return None
