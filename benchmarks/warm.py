"""Figure: 100 rollouts on a stack that is already up, and how long attaching to it takes.

Ours: `nemo-gym-env stack up` once (not timed), then `vf-eval nemo-gym-env` (5 rows x 20, 20 in
flight) timed from launch to exit; `stack_attach_s` is what its log reports for attaching to the
running stack (lease taken, agents known). Native: NeMo Gym's own start once (not timed), then
its own rollout collection (`ng_collect_rollouts`; `gym eval run --no-serve` on >= 0.7) on the
same rows timed from launch to exit. Both check all 100 rollouts; both run one release.

Each run's phases (`OURS_PHASES`, `NATIVE_PHASES`) come from what the process emits, read from
outside as it appears (`benchmarks.timeline`): ours from vf-eval's `eval.log` (verifiers' and our
log lines) and its `traces.jsonl` growing a line per rollout; native from NeMo Gym's output
lines and its results file growing a line per rollout. What a side's output cannot tell apart
is one phase, said in `UNSEPARATED`.
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import cpu_profile
from benchmarks.common import (
    ENV,
    IN_FLIGHT,
    REPEATS,
    ROWS,
    check_vf_eval,
    start_child,
    vf_eval_command,
)
from benchmarks.native import check_collected, collect_command, native_stack
from benchmarks.timeline import (
    ENDED,
    OUTPUT,
    Event,
    Mark,
    Tail,
    import_profile,
    marks_of,
    phases,
    watch,
)
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.stack import NeMoGymStack
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.shared import client

# NeMoGymEnv's log line once its stack is open (stack_access.SharedStack.describe).
_ATTACHED = re.compile(r"attached to shared NeMo Gym stack in ([\d.]+) s")

EVAL_LOG, TRACES, RESULTS = "eval.log", "traces.jsonl", "results"
"""Sources of the runs' timelines: vf-eval's log and traces files, NeMo Gym's results file."""

OURS_MARKS = {
    "run_began": Mark(
        EVAL_LOG,
        "vf-eval's eval.log created: its command line parsed (verifiers and our env module "
        "imported), the environment is loaded next",
        kind="created",
    ),
    "rows_loaded": Mark(
        EVAL_LOG,
        "verifiers' `running NxM rollouts` line: environment loaded, taskset rows listed",
        pattern=re.compile(r"running \d+x\d+ rollouts on"),
    ),
    "attached": Mark(EVAL_LOG, "our `attached to shared NeMo Gym stack` line", pattern=_ATTACHED),
    "first_result": Mark(TRACES, "the first rollout's trace line in traces.jsonl"),
    "last_result": Mark(TRACES, "the last rollout's trace line", nth=ROWS * REPEATS),
    "closed": Mark(
        EVAL_LOG,
        "verifiers' `interception down` line: env stopped (our NeMo Gym aggregate metrics "
        "written, the shared stack left), the run's close-out done",
        pattern=re.compile(r"interception down"),
    ),
    "ended": ENDED,
}
OURS_PHASES = (
    ("start", "run_began"),
    ("taskset", "rows_loaded"),
    ("attach", "attached"),
    ("first_rollout", "first_result"),
    ("rest", "last_result"),
    ("close", "closed"),
    ("exit", "ended"),
)
"""vf-eval's phases, each ended by a boundary of `OURS_MARKS`."""

NATIVE_MARKS = {
    "collection_began": Mark(
        OUTPUT,
        "NeMo Gym's first output line (`Clearing output fpath ...`), printed as its rollout "
        "collection begins",
        pattern=re.compile(r"Clearing output fpath"),
    ),
    "rows_loaded": Mark(
        RESULTS,
        "the results file created: rows read, repeated and materialized, collection dispatches",
        kind="created",
    ),
    "first_result": Mark(RESULTS, "the first rollout's line in the results file"),
    "last_result": Mark(RESULTS, "the last rollout's line", nth=ROWS * REPEATS),
    "closed": Mark(
        OUTPUT,
        "NeMo Gym's `Finished rollout collection!` line: results sorted, aggregate metrics "
        "computed and written",
        pattern=re.compile(r"Finished rollout collection!"),
    ),
    "ended": ENDED,
}
NATIVE_PHASES = (
    ("start", "collection_began"),
    ("rows", "rows_loaded"),
    ("first_rollout", "first_result"),
    ("rest", "last_result"),
    ("close", "closed"),
    ("exit", "ended"),
)
"""NeMo Gym's phases, each ended by a boundary of `NATIVE_MARKS`."""

UNSEPARATED = {
    "ours": {
        "start": "process start, imports (vf-eval, verifiers, our env module: vf-eval's "
        "command-line parse loads it) and the parse: nothing is logged before eval.log exists",
        "taskset": "verifiers' load_environment (env, harness) and our rows: no line between them",
        "attach": "verifiers' interception server, our runtime and config checks, model proxy "
        "and the lease on the shared stack (its in-process seconds: stack_attach_s)",
        "exit": "vf-eval's return from its run, the event loop's and the interpreter's exit",
    },
    "native": {
        "start": "process start, imports and its config parse: its first output line comes "
        "after all of them",
        "exit": "its rollout health check and the interpreter's exit",
        "attach": "no phase of its own: the stack is reached by URL from the config; the first "
        "rollout's request opens the connection",
    },
}
"""Per side, what one phase holds that the process's output does not tell apart."""


@dataclass
class Run:
    """One timed run of a side: its wall seconds, its phases (`phases`: each phase, `wall`,
    `other`), the 1-minute load average at its launch, and (ours) its logged attach seconds."""

    wall: float
    phases: dict[str, float]
    load_before: float
    attach: float | None = None


async def bring_up(runtime: NeMoGymVenv) -> None:
    """A persistent shared stack for ENV on `runtime` (not timed)."""
    await client.bring_up(runtime, Catalog(runtime).env(ENV).config_paths, idle_timeout=600)


async def take_down(runtime: NeMoGymVenv) -> None:
    paths = Catalog(runtime).env(ENV).config_paths
    await client.take_down(client.stack_dir(client.stack_key(runtime, paths)))


NO_RICH = "ours_no_rich"
"""The side that runs `ours_once` with verifiers' `--no-rich` (no live dashboard; logs to the
console): what a user gains by turning the dashboard off (prime-rl's env servers draw none)."""


async def ours_once(runtime: NeMoGymVenv, policy_url: str, *, rich: bool = True) -> Run:
    """One `vf-eval` on the running stack, timed from launch to exit, with its phases and its
    logged attach seconds; `rich=False`: with `--no-rich`."""
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="vfng-bench-warm-") as tmp:
        out = Path(tmp, "out")
        cmd = vf_eval_command(runtime, policy_url, out, private_stack=False)
        if not rich:
            cmd.append("--no-rich")
        tails = [
            Tail(EVAL_LOG, out, "*/logs/attempt_*/eval.log"),
            Tail(TRACES, out, "*/traces.jsonl"),
        ]
        run = await watch(cmd, tails, env={**os.environ, "SCRIPTED_KEY": "unused"})
        check_vf_eval(run.returncode, run.output, out, ROWS * REPEATS)
        return Run(run.wall, ours_phases(run.events, run.wall), load_before, attached_s(run.events))


def ours_phases(events: list[Event], wall: float) -> dict[str, float]:
    """vf-eval's phases (`OURS_PHASES`) on its timeline; PhaseError names a missing boundary."""
    return phases(marks_of(events, OURS_MARKS, "ours"), OURS_PHASES, wall, "ours")


def attached_s(events: list[Event]) -> float:
    """The attach seconds vf-eval's log reports; RuntimeError if it did not attach."""
    for event in events:
        if event.source == EVAL_LOG and (found := _ATTACHED.search(event.text)):
            return float(found.group(1))
    raise RuntimeError("vf-eval did not attach to the running stack")


async def native_once(runtime: NeMoGymVenv, stack: NeMoGymStack, rows: Path, tmp: Path) -> Run:
    """NeMo Gym's own rollout collection (100 rollouts) on the running stack, timed from launch
    to exit, with its phases."""
    load_before = os.getloadavg()[0]
    spec = Catalog(runtime).env(ENV)
    output = tmp / f"rollouts-{time.monotonic_ns()}.jsonl"
    what, cmd = collect_command(
        runtime, stack, spec.agent.name, rows, output, repeats=REPEATS, in_flight=IN_FLIGHT
    )
    run = await watch(cmd, [Tail(RESULTS, tmp, output.name)], env=runtime.env(), cwd=tmp)
    check_collected(what, run.returncode, run.output, rows, output, REPEATS)
    return Run(run.wall, native_phases(run.events, run.wall), load_before)


def native_phases(events: list[Event], wall: float) -> dict[str, float]:
    """NeMo Gym's phases (`NATIVE_PHASES`) on its timeline; PhaseError names a missing one."""
    return phases(marks_of(events, NATIVE_MARKS, "native"), NATIVE_PHASES, wall, "native")


async def ours_imports(runtime: NeMoGymVenv, policy_url: str) -> dict[str, object]:
    """One more `vf-eval` as `ours_once` runs it (not timed), with Python's import profile on
    (PYTHONPROFILEIMPORTTIME): what its imports cost and whose (`timeline.import_profile`)."""
    with tempfile.TemporaryDirectory(prefix="vfng-bench-warm-") as tmp:
        out = Path(tmp, "out")
        cmd = vf_eval_command(runtime, policy_url, out, private_stack=False)
        env = {**os.environ, "SCRIPTED_KEY": "unused", "PYTHONPROFILEIMPORTTIME": "1"}
        returncode, stdout, stderr = await _run(cmd, env, None)
        check_vf_eval(returncode, stdout + stderr, out, ROWS * REPEATS)
        return import_profile(stderr)


async def native_imports(
    runtime: NeMoGymVenv, stack: NeMoGymStack, rows: Path, tmp: Path
) -> dict[str, object]:
    """One more native collection as `native_once` runs it (not timed), with Python's import
    profile on: what its imports cost (`timeline.import_profile`)."""
    what, cmd, output = _collection(runtime, stack, rows, tmp)
    env = {**runtime.env(), "PYTHONPROFILEIMPORTTIME": "1"}
    returncode, stdout, stderr = await _run(cmd, env, tmp)
    check_collected(what, returncode, stdout + stderr, rows, output, REPEATS)
    return import_profile(stderr)


def _collection(
    runtime: NeMoGymVenv, stack: NeMoGymStack, rows: Path, tmp: Path
) -> tuple[str, list[str], Path]:
    """NeMo Gym's collection of the 100 rollouts as `native_once` runs it, for the untimed
    extra runs: (its name, its command, the results file it writes in `tmp`)."""
    spec = Catalog(runtime).env(ENV)
    output = tmp / f"rollouts-{time.monotonic_ns()}.jsonl"
    what, cmd = collect_command(
        runtime, stack, spec.agent.name, rows, output, repeats=REPEATS, in_flight=IN_FLIGHT
    )
    return what, cmd, output


async def ours_cpu(runtime: NeMoGymVenv, policy_url: str) -> dict[str, Any]:
    """One more `vf-eval` as `ours_once` runs it (not timed), sampled by py-spy: its CPU per
    rollout by whose code ran (`cpu_profile.per_rollout`)."""
    with tempfile.TemporaryDirectory(prefix="vfng-bench-warm-") as tmp:
        out = Path(tmp, "out")
        cmd = vf_eval_command(runtime, policy_url, out, private_stack=False)
        env = {**os.environ, "SCRIPTED_KEY": "unused"}
        returncode, output, profile = await cpu_profile.record(cmd, env, None)
        check_vf_eval(returncode, output, out, ROWS * REPEATS)
        return cpu_profile.per_rollout(profile, ROWS * REPEATS)


async def native_cpu(
    runtime: NeMoGymVenv, stack: NeMoGymStack, rows: Path, tmp: Path
) -> dict[str, Any]:
    """One more native collection as `native_once` runs it (not timed), sampled by py-spy."""
    what, cmd, output = _collection(runtime, stack, rows, tmp)
    returncode, out, profile = await cpu_profile.record(cmd, runtime.env(), tmp)
    check_collected(what, returncode, out, rows, output, REPEATS)
    return cpu_profile.per_rollout(profile, ROWS * REPEATS)


CPU_OWNERS = ("ours", "verifiers", "nemo_gym", cpu_profile.EVENT_LOOP)


def cpu_table(phases: dict[str, Any]) -> list[str]:
    """`details.warm_phases[side]["cpu"]` as a markdown table, one row per side: the client
    process's CPU milliseconds per rollout by owner (`-`: none of its code ran there), its
    total, and the part under inspect's signature parse (pydantic's default_factory check)."""
    lines = [
        "| side | ours | verifiers | NeMo Gym | event loop | total | of it: signature parse |",
        "|---|---|---|---|---|---|---|",
    ]
    for side in ("ours", "native"):
        if (cpu := phases.get(side, {}).get("cpu")) is None:
            continue
        by = cpu["cpu_ms_per_rollout"]
        cells = [f"{by[o]:.1f}" if o in by else "-" for o in CPU_OWNERS]
        total, signature = cpu["cpu_ms_per_rollout_total"], cpu["signature_ms_per_rollout"]
        lines.append(f"| {side} | {' | '.join(cells)} | {total:.1f} | {signature:.1f} |")
    return lines


async def _run(
    cmd: list[str], env: dict[str, str], cwd: Path | None
) -> tuple[int | None, str, str]:
    proc = await start_child(
        *cmd,
        env=env,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 1800)
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def native(runtime: NeMoGymVenv, policy_port: int) -> NeMoGymStack:
    return native_stack(runtime, Catalog(runtime).env(ENV).config_paths, policy_port)


def phase_table(phases: dict[str, Any]) -> list[str]:
    """`details.warm_phases` as a markdown table, one row per side: the medians of the wall
    time and of each phase in seconds (a phase a side does not have: `-`; ours' `taskset` in
    the `rows` column), then the import-profiled run's import seconds (ours: and how much of it
    importing verifiers and our package pulled in)."""
    columns = ("wall", "start", "rows", "attach", "first_rollout", "rest", "close", "exit", "other")
    lines = [
        "| side | wall | start | rows | attach | first rollout | rest | close | exit | other "
        "| imports (profiled run) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for side in ("ours", NO_RICH, "native"):
        if side not in phases:  # a run from before the side existed
            continue
        medians = dict(phases[side]["phases"])
        if "taskset" in medians:
            medians["rows"] = medians.pop("taskset")
        # + 0.0: a tiny negative `other` (clock rounding) shows as 0.00, not -0.00
        cells = [f"{medians[c] + 0.0:.2f}" if c in medians else "-" for c in columns]
        if (imports := phases[side].get("imports")) is None:
            lines.append(f"| {side} (`--no-rich`) | {' | '.join(cells)} | - |")
            continue
        owners = imports["by_owner"]
        split = (
            f" (verifiers {owners['verifiers']:.1f}, ours {owners['ours']:.1f})"
            if "ours" in owners
            else ""
        )
        lines.append(f"| {side} | {' | '.join(cells)} | {imports['total_s']:.1f}{split} |")
    return lines
