"""Sandbox providers behind one contract (docs/containers.md, "Providers").

A provider module gives a `Provider` for one stack: `check` (one-line errors before anything is
made), `sweep` (what dead stacks left), `prepare` (config entries merged after the user's
configs, and the door's address as its sandboxes see it), `route` (the config that routes its
sandboxes' model calls to the door the stack started there, and labels and bounds them),
`isolation` (one line: what it can promise, or what it cannot) and `stop` (removes what the
stack made, through the provider's own API for a remote one; `stop_module`, when it has one,
does it again from the stack's supervisor, whoever ended the stack).
`containers.seam.StackSandboxes`
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

    @property
    def stop_module(self) -> str | None:
        """A module the stack's supervisor runs (`python -I -m <module> --stop <marker>`, in the
        stack's folder) once the stack's servers are gone, also after its owner was SIGKILLed:
        it removes the stack's sandboxes as `stop` does. None: `stop` alone."""

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


@dataclass(frozen=True)
class ProviderFacts:
    """What this package promises for one provider (or one kind), as `nemo-gym-env list` and
    docs/containers.md's provider table print it."""

    names: str
    module: str
    """The module that runs it here (`providers/<module>`)."""
    tested: str
    """What runs it in this package's tests."""
    isolated: str
    """What isolates its sandboxes, and how (or that nothing does)."""
    cluster: str
    """What a user on a cluster must set."""


PROVIDER_FACTS: tuple[ProviderFacts, ...] = (
    ProviderFacts(
        "`docker`",
        "`providers/docker.py`",
        "swebench_pro, terminal_bench_2_1, swe_next end to end; Ctrl-C, SIGKILL, deadline, "
        "sweep (`tests/stack/containers/test_containers.py`)",
        "yes: the stack's internal network, the door (its rollouts' routes only), an iptables "
        "firewall, labels, bounds, removal by the supervisor; refused without root, iptables or "
        "a local rootful daemon unless opted in",
        "a local rootful docker daemon where the env server runs, root, iptables, the images",
    ),
    ProviderFacts(
        "`opensandbox`",
        "`providers/opensandbox.py`",
        "swebench_pro, terminal_bench_2_1 against the real `opensandbox-server` 1.1.1 (docker "
        "runtime) and the stand-in execd: eval and train through prime-rl's env server, "
        "vf-eval, deadline, SIGKILL, the server killed mid-run, sweep "
        "(`tests/stack/containers/test_opensandbox.py`)",
        "no (no egress policy set): refused unless opted in; the door, metadata labels, "
        "deletion through the server's API",
        "`OPENSANDBOX_DOMAIN`, `OPENSANDBOX_API_KEY`, `VF_NEMOGYM_DOOR_HOST` (an address the "
        "pods reach), the opt-in",
    ),
    ProviderFacts(
        "`apptainer`, `enroot`, `daytona`, `e2b`, `ecs_fargate`, `local`, `openshell`",
        "`providers/passthrough.py`",
        "refusal and its line only (`tests/containers/test_seam.py`); no sandbox runs",
        "no: refused unless opted in; one warning line says nemo-gym-env does not isolate, "
        "label, route, bound or sweep them (they go when NeMo Gym's provider removes them)",
        "what NeMo Gym's provider config asks for (its credentials, endpoint), the opt-in",
    ),
    ProviderFacts(
        "plug-ins (entry point group `nemo_gym.sandbox_providers`)",
        "`providers/passthrough.py`",
        "a swebench_pro rollout end to end through a test plug-in (NeMo Gym's docker provider "
        "registered by entry point as `fake_plugin`, installed with `sandbox_packages`; "
        "`tests/stack/containers/test_plugin_provider.py`); refusal and its line "
        "(`tests/containers/test_seam.py`)",
        "no: as the line above, the warning naming the entry point group; no door, so its "
        "sandboxes must reach the model server's address themselves",
        "the plug-in's package (`sandbox_packages`), its config block, the opt-in",
    ),
)
"""One row per provider or kind, in the order `nemo-gym-env list` prints them."""


def provider_table() -> list[str]:
    """`PROVIDER_FACTS` as Markdown table lines (header first)."""
    lines = [
        "| provider | module | tested here | isolated | on a cluster, set |",
        "|---|---|---|---|---|",
    ]
    for f in PROVIDER_FACTS:
        lines.append(f"| {f.names} | {f.module} | {f.tested} | {f.isolated} | {f.cluster} |")
    return lines
