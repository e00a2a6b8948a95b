"""Figure 1: 100 rollouts end to end, stack start and stop included.

Ours: `vf-eval nemo-gym-env` (5 example rows x 20, 20 in flight) against the scripted policy.
Native: `ng_run` (NeMo Gym's own start) + `ng_collect_rollouts` on the same rows (20 repeats,
20 in parallel) with the same policy as `policy_model`, then the stack stopped. Both runs
check that all 100 rollouts came back.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ENV, timed_vf_eval
from benchmarks.native import collect_rollouts, native_stack
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.venv import NeMoGymVenv

ROWS, REPEATS, IN_FLIGHT = 5, 20, 20


async def ours_once(policy_url: str) -> float:
    """Wall seconds of one `vf-eval` run."""
    with tempfile.TemporaryDirectory(prefix="vfng-bench-e2e-") as tmp:
        cmd = [
            str(Path(sys.executable).with_name("vf-eval")), "nemo-gym-env", "-m", "scripted",
            "--client.base-url", policy_url, "--client.api-key-var", "SCRIPTED_KEY",
            "-n", str(ROWS), "-r", str(REPEATS), "-c", str(IN_FLIGHT), "--no-push",
            "-o", f"{tmp}/out", "--env.taskset.nemo-env", ENV,
            # A private stack: this figure times start + rollouts + stop (see warm.py for a
            # stack that is already up).
            "--env.taskset.shared-stack", "False",
        ]  # fmt: skip
        return await timed_vf_eval(cmd, Path(tmp, "out"), ROWS * REPEATS)


async def native_once(runtime: NeMoGymVenv, policy_port: int) -> float:
    """Wall seconds of ng_run start + ng_collect_rollouts + stop."""
    spec = Catalog(runtime).env(ENV)
    with tempfile.TemporaryDirectory(prefix="vfng-bench-e2e-") as tmp:
        rows = Path(tmp, "rows.jsonl")
        lines = spec.dataset("example").read_text().splitlines()
        rows.write_text("\n".join([line for line in lines if line.strip()][:ROWS]) + "\n")
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
