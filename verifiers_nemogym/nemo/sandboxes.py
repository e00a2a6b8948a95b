"""The seam between a stack and its sandboxes: what `nemo/stack.py` asks of whatever prepares
the sandboxes its servers start, without knowing any provider (docs/architecture.md).

A stack is given a `SandboxesFactory` by the layer above it (`stack_access`, the shared stack's
host, tests); `containers.seam.StackSandboxes` is the one this package ships (docker,
OpenSandbox and every other NeMo Gym provider behind `containers.providers.Provider`). `nemo/`
never imports `containers/` (tests/test_imports.py): the contract lives here, below both.
A stack given no factory refuses configs that start sandboxes (`sandbox_servers`), one line
before anything starts: sandboxes nobody prepared would run unlabelled and unisolated.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.nemo.catalog import (
    AGENTS,
    ENVIRONMENT_SERVERS,
    RESOURCES_SERVERS,
    merge_configs,
    server_blocks,
)
from verifiers_nemogym.nemo.venv import NeMoGymVenv

PROVIDER_REF = "sandbox_provider"
"""The server setting naming its sandbox provider (NeMo Gym 0.7+)."""
DEFAULT_PROVIDERS: dict[str, str | dict[str, Any]] = {
    "anyterminal_agent": {"docker": {}},
    "anyswe_agent": "sandbox",
    "harness_exa_search": "sandbox",
    "hermes_sandboxed_agent": "sandbox",
}
"""Agent type -> the `sandbox_provider` it takes when its config has none (NeMo Gym 0.7.0's
defaults for those agents' config fields)."""


def provider_refs(merged: dict[str, Any]) -> Iterator[tuple[str, str, str, dict[str, Any], Any]]:
    """`(server type, instance, impl, settings, provider reference)` of each server of `merged`
    (one merged config) that starts sandboxes: its `sandbox_provider` setting, or the default of
    its agent type (`DEFAULT_PROVIDERS`)."""
    for server_type in (AGENTS, RESOURCES_SERVERS, ENVIRONMENT_SERVERS):
        for instance, (impl, settings) in server_blocks(merged, server_type).items():
            ref = settings.get(PROVIDER_REF)
            if ref is None and server_type == AGENTS:
                ref = DEFAULT_PROVIDERS.get(impl)
            if ref is not None:
                yield server_type, instance, impl, settings, ref


def sandbox_servers(merged: dict[str, Any]) -> list[str]:
    """The server instances of `merged` (one merged config) that start sandboxes."""
    return [instance for _, instance, _, _, _ in provider_refs(merged)]


class StackSandboxes(Protocol):
    """What one stack's sandboxes need from before its start to after its stop."""

    async def prepare(
        self, merged: list[dict[str, Any]], venv: NeMoGymVenv, workdir: Path
    ) -> Path | None:
        """Check, sweep and make what the sandboxes of `merged` (the stack's configs, in order)
        need; the config path the stack adds after the user's configs, None when no server
        starts a sandbox. One-line ConfigError/StackError before anything is made for what is
        missing or cannot be isolated."""

    def supervisor_args(self) -> list[str]:
        """Arguments for the stack's supervisor (`nemo/supervisor.py`): what it removes
        whatever stops the stack (docker: `--docker-label <label>`; OpenSandbox: `--sandbox-stop
        <module>`, which deletes its sandboxes through the server). Read after `prepare`."""

    async def stop(self) -> None:
        """Remove every sandbox and object `prepare` made; idempotent."""


class SandboxesFactory(Protocol):
    """Makes a stack's `StackSandboxes`: the stack's `marker`, the URL its sandboxes' model
    calls go to (`policy_url`), its log, whether sandboxes the package cannot isolate are
    accepted (`allow_unisolated`), and the requirement lines added to the venvs of the servers
    that start sandboxes (`packages`, e.g. a NeMo Gym plug-in's provider)."""

    def __call__(
        self,
        marker: str,
        policy_url: str,
        log: logging.Logger,
        *,
        allow_unisolated: bool = False,
        packages: Sequence[str] = (),
    ) -> StackSandboxes: ...


class Unprepared:
    """The `StackSandboxes` of a stack given no factory: refuses configs that start sandboxes."""

    async def prepare(
        self, merged: list[dict[str, Any]], venv: NeMoGymVenv, workdir: Path
    ) -> Path | None:
        servers = sandbox_servers(merge_configs(merged))
        if servers:
            raise ConfigError(
                f"{', '.join(servers)} start sandboxes, but this stack was given no sandbox "
                "provider (NeMoGymStack(..., sandboxes=containers.seam.StackSandboxes))"
            )
        return None

    def supervisor_args(self) -> list[str]:
        return []

    async def stop(self) -> None:
        return None
