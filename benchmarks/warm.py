"""Figure: 100 rollouts on a stack that is already up, and how long attaching to it takes.

Ours: `nemo-gym-env stack up` once (not timed), then `vf-eval nemo-gym-env` (5 rows x 20, 20 in
flight) timed from launch to exit; `stack_attach_s` is what its log reports for attaching to the
running stack (lease taken, agents known). Native: `ng_run` once (not timed), then
`ng_collect_rollouts` on the same rows timed from launch to exit. Both check all 100 rollouts.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ENV, timed_vf_eval
from benchmarks.end_to_end import IN_FLIGHT, REPEATS, ROWS
from benchmarks.native import collect_rollouts, native_stack
from verifiers_nemogym.nemo import shared
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.venv import NeMoGymVenv

_ATTACHED = "attached to shared NeMo Gym stack in "


async def bring_up(runtime: NeMoGymVenv) -> None:
    """A persistent shared stack for ENV (not timed)."""
    await shared.bring_up(runtime, Catalog(runtime).env(ENV).config_paths, idle_timeout=600)


async def take_down(runtime: NeMoGymVenv) -> None:
    paths = Catalog(runtime).env(ENV).config_paths
    await shared.take_down(shared.stack_dir(shared.stack_key(runtime, paths)))


async def ours_once(policy_url: str) -> tuple[float, float]:
    """(wall seconds of one `vf-eval` on the running stack, its logged attach seconds)."""
    with tempfile.TemporaryDirectory(prefix="vfng-bench-warm-") as tmp:
        cmd = [
            str(Path(sys.executable).with_name("vf-eval")), "nemo-gym-env", "-m", "scripted",
            "--client.base-url", policy_url, "--client.api-key-var", "SCRIPTED_KEY",
            "-n", str(ROWS), "-r", str(REPEATS), "-c", str(IN_FLIGHT), "--no-push",
            "-o", f"{tmp}/out", "--env.taskset.nemo-env", ENV,
        ]  # fmt: skip
        elapsed = await timed_vf_eval(cmd, Path(tmp, "out"), ROWS * REPEATS)
        (log,) = Path(tmp, "out").glob("*/logs/latest/eval.log")
        line = next((x for x in log.read_text().splitlines() if _ATTACHED in x), None)
        if line is None:
            raise RuntimeError("vf-eval did not attach to the running stack")
        attach = float(line.split(_ATTACHED, 1)[1].split(" s", 1)[0])
        return elapsed, attach


async def native_once(runtime: NeMoGymVenv, stack: object, rows: Path, tmp: Path) -> float:
    """Wall seconds of `ng_collect_rollouts` (100 rollouts) on the running native stack."""
    spec = Catalog(runtime).env(ENV)
    output = tmp / f"rollouts-{time.monotonic_ns()}.jsonl"
    began = time.monotonic()
    await collect_rollouts(
        runtime, stack, spec.agent.name, rows, output,  # type: ignore[arg-type]
        repeats=REPEATS, in_flight=IN_FLIGHT,
    )  # fmt: skip
    return time.monotonic() - began


def rows_file(runtime: NeMoGymVenv, tmp: Path) -> Path:
    lines = Catalog(runtime).env(ENV).dataset("example").read_text().splitlines()
    rows = tmp / "rows.jsonl"
    rows.write_text("\n".join([line for line in lines if line.strip()][:ROWS]) + "\n")
    return rows


def native(runtime: NeMoGymVenv, policy_port: int) -> object:
    return native_stack(runtime, Catalog(runtime).env(ENV).config_paths, policy_port)
