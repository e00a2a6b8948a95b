"""Figure: 100 rollouts on a stack that is already up, and how long attaching to it takes.

Ours: `nemo-gym-env stack up` once (not timed), then `vf-eval nemo-gym-env` (5 rows x 20, 20 in
flight) timed from launch to exit; `stack_attach_s` is what its log reports for attaching to the
running stack (lease taken, agents known). Native: NeMo Gym's own start once (not timed), then
its own rollout collection (`ng_collect_rollouts`; `gym eval run --no-serve` on >= 0.7) on the
same rows timed from launch to exit. Both check all 100 rollouts; both run one release.
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

from benchmarks.common import ENV, IN_FLIGHT, REPEATS, ROWS, timed_vf_eval, vf_eval_command
from benchmarks.native import collect_rollouts, native_stack
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.stack import NeMoGymStack
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.shared import client

# NeMoGymEnv's log line once its stack is open (stack_access.SharedStack.describe).
_ATTACHED = re.compile(r"attached to shared NeMo Gym stack in ([\d.]+) s")


async def bring_up(runtime: NeMoGymVenv) -> None:
    """A persistent shared stack for ENV on `runtime` (not timed)."""
    await client.bring_up(runtime, Catalog(runtime).env(ENV).config_paths, idle_timeout=600)


async def take_down(runtime: NeMoGymVenv) -> None:
    paths = Catalog(runtime).env(ENV).config_paths
    await client.take_down(client.stack_dir(client.stack_key(runtime, paths)))


async def ours_once(runtime: NeMoGymVenv, policy_url: str) -> tuple[float, float]:
    """(wall seconds of one `vf-eval` on the running stack, its logged attach seconds)."""
    with tempfile.TemporaryDirectory(prefix="vfng-bench-warm-") as tmp:
        cmd = vf_eval_command(runtime, policy_url, Path(tmp, "out"), private_stack=False)
        elapsed = await timed_vf_eval(cmd, Path(tmp, "out"), ROWS * REPEATS)
        (log,) = Path(tmp, "out").glob("*/logs/latest/eval.log")
        found = _ATTACHED.search(log.read_text())
        if found is None:
            raise RuntimeError("vf-eval did not attach to the running stack")
        attach = float(found.group(1))
        return elapsed, attach


async def native_once(runtime: NeMoGymVenv, stack: NeMoGymStack, rows: Path, tmp: Path) -> float:
    """Wall seconds of NeMo Gym's own rollout collection (100 rollouts) on the running stack."""
    spec = Catalog(runtime).env(ENV)
    output = tmp / f"rollouts-{time.monotonic_ns()}.jsonl"
    began = time.monotonic()
    await collect_rollouts(
        runtime, stack, spec.agent.name, rows, output, repeats=REPEATS, in_flight=IN_FLIGHT
    )
    return time.monotonic() - began


def native(runtime: NeMoGymVenv, policy_port: int) -> NeMoGymStack:
    return native_stack(runtime, Catalog(runtime).env(ENV).config_paths, policy_port)
