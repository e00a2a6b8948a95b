"""Shared fixtures: the real NeMo Gym runtime (created on first use, then cached)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from verifiers_nemogym.nemo.supervisor import processes_with_env
from verifiers_nemogym.nemo.venv import NeMoGymVenv, ensure_venv

SHARED_STACK_GONE_S = 60.0
"""Bound on a shared stack's exit after its last user left: the idle grace (5 s by default)
plus the stack's teardown (NeMo Gym's own shutdown, then the supervisor's SIGTERM/SIGKILL)."""


async def wait_gone(entry: str, seconds: float = SHARED_STACK_GONE_S) -> list[int]:
    """Wait (bounded) until no process carries `entry` (`NAME=value` in its environment);
    return the survivors."""
    deadline = time.monotonic() + seconds
    while (alive := processes_with_env(entry)) and time.monotonic() < deadline:
        await asyncio.sleep(0.25)
    return alive


@pytest.fixture(scope="session")
def nemo_venv() -> NeMoGymVenv:
    """The NeMo Gym 0.4.0 runtime venv; the first test run creates it (about a minute)."""
    return ensure_venv()


class SecretWatch:
    """Collects the secrets of a running nemo-gym-env (the proxy's, and every rollout's bearer
    secret as its route opens) so a test can check that none reached a trace, log or error.
    It only observes: `open_route` still runs unchanged."""

    def __init__(self) -> None:
        self.secrets: set[str] = set()

    def watch(self, env: Any) -> None:
        """Start watching `env`, inside its `serving()` block."""
        proxy = env.taskset.config.task._live.proxy
        self.secrets.add(proxy.secret)
        original = proxy.open_route

        def open_route(endpoint: str, secret: str, *args: Any, **kwargs: Any) -> Any:
            self.secrets.add(secret)
            return original(endpoint, secret, *args, **kwargs)

        proxy.open_route = open_route

    def assert_absent(self, texts: dict[str, str]) -> None:
        """No watched secret occurs in any of `texts` (name -> text)."""
        assert len(self.secrets) > 1, "no rollout was watched"
        for name, text in texts.items():
            for secret in self.secrets:
                assert secret not in text, f"a secret leaked into {name}"


@pytest.fixture
def secret_watch() -> SecretWatch:
    return SecretWatch()
