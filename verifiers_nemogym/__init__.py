"""verifiers-nemogym: NVIDIA NeMo Gym environments inside verifiers (v1).

`NeMoGymTaskset` loads NeMo Gym rows, `NeMoGymHarness` runs each through NeMo Gym's own agent
server, `NeMoGymEnv` owns the NeMo Gym stack of its process, and `NeMoGymModelProxy` routes every
model call of a rollout to that rollout's verifiers endpoint.

Names are imported lazily, so helper processes (the local model's child, `python -m
verifiers_nemogym.policies.local_model`) start without importing verifiers.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "NeMoGymEnv": "env",
    "NeMoGymEnvConfig": "env",
    "ConfigError": "errors",
    "NeMoGymError": "errors",
    "AgentRunError": "errors",
    "VenvSetupError": "errors",
    "StackError": "errors",
    "NeMoGymHarness": "harness",
    "NeMoGymHarnessConfig": "harness",
    "NeMoGymModelProxy": "bridge.proxy",
    "ProxyLimits": "bridge.proxy",
    "RetryPolicy": "retry",
    "NeMoGymData": "taskset",
    "NeMoGymTask": "taskset",
    "NeMoGymTaskConfig": "taskset",
    "NeMoGymTaskset": "taskset",
    "NeMoGymTasksetConfig": "taskset",
    "follow_verifiers_logging": "logs",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'verifiers_nemogym' has no attribute {name!r}")
    return getattr(importlib.import_module(f"verifiers_nemogym.{module}"), name)
