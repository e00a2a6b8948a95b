"""LiveStack: what `NeMoGymEnv.start()` hands to every rollout of its process.

It rides on the shared task config, so it must survive the copies verifiers makes of task
objects: a deep copy returns the same handle (a running server cannot be copied).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp

from verifiers_nemogym.proxy import NeMoGymModelProxy


@dataclass(eq=False)
class LiveStack:
    """The model proxy, the agents' base URLs by instance name, and one HTTP client for `/run`."""

    proxy: NeMoGymModelProxy
    agents: dict[str, str]
    http: aiohttp.ClientSession
    run_timeout: float
    """Seconds one `/run` may take (`--env.taskset.task.run-timeout`)."""
    warned: set[str] = field(default_factory=set)
    """One-time warnings already logged in this process (e.g. row sampling fields)."""

    def __deepcopy__(self, memo: dict[int, Any]) -> LiveStack:
        return self

    def __copy__(self) -> LiveStack:
        return self
