"""verifiers-nemogym: NVIDIA NeMo Gym environments inside verifiers (v1).

`NeMoGymTaskset` loads NeMo Gym rows, `NeMoGymHarness` runs each through NeMo Gym's own agent
server, `NeMoGymEnv` owns the NeMo Gym stack of its process, and `NeMoGymModelProxy` routes every
model call of a rollout to that rollout's verifiers endpoint.

Names are imported lazily, so helper processes (the local model's child, `python -m
verifiers_nemogym.policies.local_model`) start without importing verifiers.
"""

from __future__ import annotations

from typing import Any

from verifiers_nemogym.exports import exported, public

_EXPORTS = {
    "env": ("NeMoGymEnv", "NeMoGymEnvConfig"),
    "errors": ("AgentRunError", "ConfigError", "NeMoGymError", "StackError", "VenvSetupError"),
    "harness": ("NeMoGymHarness", "NeMoGymHarnessConfig"),
    "bridge.proxy": ("NeMoGymModelProxy", "ProxyLimits"),
    "retry": ("RetryPolicy",),
    "taskset": (
        "NeMoGymData",
        "NeMoGymTask",
        "NeMoGymTaskConfig",
        "NeMoGymTaskset",
        "NeMoGymTasksetConfig",
    ),
    "logs": ("follow_verifiers_logging",),
}

__all__ = public(_EXPORTS)


def __getattr__(name: str) -> Any:
    return exported(__name__, _EXPORTS, name)
