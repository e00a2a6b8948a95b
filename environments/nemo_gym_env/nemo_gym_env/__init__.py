"""nemo-gym-env: NeMo Gym environments run by NeMo Gym's own agents, through verifiers.

Exports exactly one Taskset, Harness and Env (verifiers' discovery rule) plus `load_environment`,
the short form of `vf.load_environment(vf.resolve_env_config({"taskset": {...}}))`.

Importing this module hands the package's logging to verifiers' logger (see
`verifiers_nemogym.logs`): verifiers' CLIs import it before they set up their handlers, and
this is the one import every way of loading the env goes through.
"""

from __future__ import annotations

from typing import Any

import verifiers.v1 as vf

from verifiers_nemogym import (
    NeMoGymEnv,
    NeMoGymHarness,
    NeMoGymTaskset,
    follow_verifiers_logging,
)

ENV_ID = "nemo-gym-env"

follow_verifiers_logging()


def load_environment(**taskset: Any) -> NeMoGymEnv:
    """The env for taskset fields given as keywords, e.g.
    `load_environment(nemo_env="example_single_tool_call")`."""
    env = vf.load_environment(vf.resolve_env_config({"taskset": {"id": ENV_ID, **taskset}}))
    assert isinstance(env, NeMoGymEnv)
    return env


__all__ = ["NeMoGymEnv", "NeMoGymHarness", "NeMoGymTaskset", "load_environment"]
