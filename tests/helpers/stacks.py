"""Stacks for the tests: a shared stack held for a module (`hold_shared_stack`), a stack whose start
command is read and never run, the releases the release tests run on, and the stack host's log.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from verifiers_nemogym.nemo.stack import NeMoGymStack
from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR as STACK_MARKER_VAR
from verifiers_nemogym.shared import protocol

if TYPE_CHECKING:
    from verifiers_nemogym.nemo.venv import NeMoGymVenv
from helpers.processes import SHARED_STACK_GONE_S, gone, until


@dataclass(frozen=True)
class HeldStack:
    """A shared stack held open by a lease of the test module's own (`hold_shared_stack`):
    its process `marker` and its `directory` (where the host's socket is)."""

    marker: str
    directory: Path

    def owns(self, env: Any) -> bool:
        """Whether `env` (inside `serving()`) attached to this stack."""
        return env.stack_marker == self.marker

    async def released(self) -> None:
        """Wait (bounded) until the holder's lease is the host's only one again: every env a
        test opened on the stack has left it, and the stack is still up."""

        async def alone() -> bool:
            return (await protocol.status(self.directory))["users"] == 1

        await until(alone, SHARED_STACK_GONE_S, "the test's envs to leave the held stack")


@contextlib.asynccontextmanager
async def hold_shared_stack(**options: Any) -> AsyncIterator[HeldStack]:
    """Start the shared stack `nemo_gym_env.load_environment(**options)` uses and hold it for
    the block, so several tests on the same config set attach to one stack instead of each
    starting its own (a stack start is the slow tier's main cost). The holder must start it
    (none may run before). Afterwards, the stack and every process of it is gone (bounded by
    `SHARED_STACK_GONE_S`): the no-orphan check of the tests that shared it."""
    import nemo_gym_env
    from verifiers_nemogym.stack_access import SharedStack

    env = nemo_gym_env.load_environment(**options)
    async with env.serving():
        stack = env.stack
        assert isinstance(stack, SharedStack), env.start_error
        assert stack.lease.started, "a shared stack for this config set already ran"
        held = HeldStack(stack.lease.marker, stack.lease.directory)
        yield held
    assert await gone(f"{STACK_MARKER_VAR}={held.marker}") == []


PLACEHOLDER_CONFIG = Path("/nonexistent/vf_external_model.yaml")
"""A policy placeholder config path for start commands that are built, never run."""


def unstarted_stack(venv: Any, configs: list[Path], timeout: float = 300) -> NeMoGymStack:
    """A `NeMoGymStack` for `configs` whose start command is read, never started."""
    return NeMoGymStack(
        venv, configs, policy_host="127.0.0.1", policy_port=9, start_timeout=timeout
    )


VERSIONS = ["0.4.0", "0.7.0-below-floor"]
"""Test ids of the NeMo Gym releases the end-to-end and conformance tests run on: 0.7.0 on a
Python below its declared floor (3.13.14; none here), with the package's explicit opt-in."""

SURVEYED_ON_040 = pytest.mark.parametrize(
    "any_nemo_venv",
    [pytest.param(VERSIONS[0], marks=pytest.mark.survey), *VERSIONS[1:]],
    indirect=True,
)
"""A test over `any_nemo_venv` whose 0.4.0 case is surveyed (tests/survey.sh), not run by CI:
it repeats on 0.4.0 what CI shows on 0.7.0 and, on 0.4.0, through other tests."""


def runtime_flags(runtime: NeMoGymVenv) -> list[str]:
    """vf-eval flags choosing `runtime`'s NeMo Gym release and Python, with the opt-in to a
    Python below the release's floor where `runtime` is one."""
    flags = ["--env.taskset.nemo-gym-version", runtime.nemo_gym_version]
    flags += ["--env.taskset.python", str(runtime.python)]
    if runtime.below_floor:
        flags += ["--env.taskset.allow-python-below-floor", "true"]
    return flags


def stack_host_log(out: Path) -> str:
    """The text of the shared stack host's log named (`log: ...host.log`) in the eval log of
    the vf-eval run under `out`."""
    eval_log = next(out.glob("*/logs/latest/eval.log")).read_text()
    host_log = re.search(r"log: (\S+host\.log)", eval_log)
    assert host_log is not None, eval_log[-2000:]
    return Path(host_log.group(1)).read_text()
