"""Figure 1: 100 rollouts end to end, stack start and stop included, both sides on one release.

Ours: `vf-eval nemo-gym-env` (5 example rows x 20, 20 in flight) against the scripted policy,
on a private stack. Native: NeMo Gym's own start (`ng_run`; `gym env start` on >= 0.7) and its
own rollout collection (`ng_collect_rollouts`; `gym eval run --no-serve` on >= 0.7) on the same
rows (20 repeats, 20 in parallel) with the same policy as `policy_model`, then the stack
stopped. Both runs check that all 100 rollouts came back. The release is the runtime's
(`common.bench_runtime`), the same for both sides.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benchmarks.common import ENV, IN_FLIGHT, REPEATS, ROWS, timed_vf_eval, vf_eval_command
from benchmarks.native import collect_rollouts, native_stack, rows_file
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.venv import NeMoGymVenv


async def ours_once(runtime: NeMoGymVenv, policy_url: str) -> float:
    """Wall seconds of one `vf-eval` run on a private stack of `runtime`'s release."""
    with tempfile.TemporaryDirectory(prefix="vfng-bench-e2e-") as tmp:
        # A private stack: this figure times start + rollouts + stop (see warm.py for a
        # stack that is already up).
        cmd = vf_eval_command(runtime, policy_url, Path(tmp, "out"), private_stack=True)
        return await timed_vf_eval(cmd, Path(tmp, "out"), ROWS * REPEATS)


async def native_once(runtime: NeMoGymVenv, policy_port: int) -> float:
    """Wall seconds of NeMo Gym's own start + rollout collection + stop."""
    spec = Catalog(runtime).env(ENV)
    with tempfile.TemporaryDirectory(prefix="vfng-bench-e2e-") as tmp:
        rows = rows_file(runtime, Path(tmp))
        began = time.monotonic()
        stack = native_stack(runtime, spec.config_paths, policy_port)
        try:
            await stack.start()
            await collect_rollouts(
                runtime, stack, spec.agent.name, rows, Path(tmp, "rollouts.jsonl"),
                repeats=REPEATS, in_flight=IN_FLIGHT,
            )  # fmt: skip
        finally:
            await stack.stop()
        return time.monotonic() - began
