"""Shared pieces of the benchmarks: helper processes, statistics, memory readings.

Helper processes (scripted policy, echo server, proxy) run as separate Python processes so that
client, proxy and upstream never share an event loop or a core's GIL. Every helper is started
with `spawn()` and must be stopped with `Helper.stop()` (also on errors: use `async with`).
Every child a benchmark starts goes through `start_child()`, which also stops it when the
benchmark dies without stopping it (SIGTERM, SIGKILL): no helper outlives its benchmark.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verifiers_nemogym.nemo.supervisor import (
    argv_of,
    die_with_parent,
    parent_of,
    processes_with_env,
    rss_bytes,
)
from verifiers_nemogym.nemo.venv import DEFAULT_NEMO_GYM_VERSION, NeMoGymVenv, ensure_venv

ENV = "example_single_tool_call"
"""The NeMo Gym environment every figure runs (5 example rows, one tool call per rollout)."""

VERSION_VAR = "VF_NEMOGYM_BENCH_NEMO_GYM_VERSION"
"""nemo-gym release both sides run (default the package's); with `PYTHON_VAR`, its Python.
Both sides always use the same release: a 0.7 figure is never compared with a 0.4 one. Set by
`python -m benchmarks --nemo-gym-version`, read here and by the fresh processes some figures
are measured in; the below-floor opt-in travels as $VF_NEMOGYM_ALLOW_PYTHON_BELOW_FLOOR."""
PYTHON_VAR = "VF_NEMOGYM_BENCH_PYTHON"

ROWS, REPEATS, IN_FLIGHT = 5, 20, 20
"""The 100-rollout run of the end-to-end figures: example rows, repeats of each, in flight."""


@dataclass
class Helper:
    """A helper process that printed one JSON line describing itself on start."""

    proc: asyncio.subprocess.Process
    info: dict[str, Any]

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def command(self, line: str) -> Any:
        """Send one command line; return the JSON line it answers."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()
        return json.loads(await asyncio.wait_for(self.proc.stdout.readline(), 60))

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()

    async def __aenter__(self) -> Helper:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def start_child(*cmd: str, **options: Any) -> asyncio.subprocess.Process:
    """`asyncio.create_subprocess_exec(*cmd, **options)` for a child that gets SIGTERM from the
    kernel when this process dies, however it dies: a benchmark stopped by SIGTERM (whose
    default action skips every `finally`) or SIGKILL leaves no helper behind. Call it from the
    thread running the benchmark's event loop for good (the signal follows the forking
    thread); the child's own children need the same (a private stack's supervisor has it)."""
    die = die_with_parent(os.getpid(), signal.SIGTERM)
    return await asyncio.create_subprocess_exec(*cmd, preexec_fn=die, **options)


async def spawn(module: str, *args: str) -> Helper:
    """Start `python -m module args...` (by `start_child`); it must print one JSON line once it
    serves."""
    proc = await start_child(
        sys.executable, "-m", module, *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        return Helper(proc, json.loads(line))
    except BaseException:
        proc.kill()
        await proc.wait()
        raise


async def spawn_policy() -> Helper:
    """The package's ScriptedPolicy in its own process; `info["base_url"]` ends in /v1."""
    return await spawn("benchmarks.servers", "policy")


def rss_mb(pid: int) -> float:
    """Resident memory of `pid` in MiB (from /proc); RuntimeError if it is gone."""
    if not (found := rss_bytes(pid)):
        raise RuntimeError(f"no VmRSS for pid {pid}")
    return found / 2**20


def cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) `pid` has used so far; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(values: list[float]) -> dict[str, Any]:
    """Median and spread of repeated measurements."""
    values = [float(v) for v in values]
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0, "values": []}
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "values": values,
    }


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def bench_runtime() -> NeMoGymVenv:
    """The runtime of the release the benchmarks run (`VERSION_VAR`, default the package's
    default release), created if absent."""
    version = os.environ.get(VERSION_VAR) or DEFAULT_NEMO_GYM_VERSION
    return ensure_venv(version, os.environ.get(PYTHON_VAR) or None)


def private_env(runtime: NeMoGymVenv, **options: Any) -> Any:
    """nemo-gym-env's environment on a private stack of `runtime` (its release, Python and
    below-floor opt-in), with `options` as `nemo_gym_env.load_environment` takes them."""
    import nemo_gym_env

    return nemo_gym_env.load_environment(
        shared_stack=False,
        nemo_gym_version=runtime.nemo_gym_version,
        python=str(runtime.python),
        allow_python_below_floor=runtime.below_floor,
        **options,
    )


@contextlib.asynccontextmanager
async def timed_serving(env: Any) -> AsyncIterator[float]:
    """`env.serving()`, yielding the seconds its stack took to start; a start that failed is a
    RuntimeError with the stack's reason."""
    began = time.monotonic()
    async with env.serving():
        start_s = time.monotonic() - began
        if env.start_error is not None:
            raise RuntimeError(env.start_error)
        yield start_s


def model_context(model: str, base_url: str) -> Any:
    """verifiers' model context for `model` served at `base_url` through its eval client (the
    key is read from `VF_NEMOGYM_BENCH_KEY`, a placeholder unless set)."""
    import verifiers.v1 as vf
    from verifiers.v1.configs.client import EvalClientConfig

    os.environ.setdefault("VF_NEMOGYM_BENCH_KEY", "unused")
    client = EvalClientConfig(base_url=base_url, api_key_var="VF_NEMOGYM_BENCH_KEY")
    return vf.ModelContext(model=model, client=client)


def vf_eval_command(
    runtime: NeMoGymVenv, policy_url: str, outdir: Path, *, private_stack: bool
) -> list[str]:
    """`vf-eval nemo-gym-env` for the 100-rollout run on `runtime`'s release and Python, against
    the scripted policy at `policy_url`, results in `outdir`. `private_stack`: start and stop
    a stack of its own; else attach to the shared one (e.g. after `stack up`)."""
    cmd = [
        str(Path(sys.executable).with_name("vf-eval")), "nemo-gym-env", "-m", "scripted",
        "--client.base-url", policy_url, "--client.api-key-var", "SCRIPTED_KEY",
        "-n", str(ROWS), "-r", str(REPEATS), "-c", str(IN_FLIGHT), "--no-push",
        "-o", str(outdir), "--env.taskset.nemo-env", ENV,
        # The release and Python named, not left to vf-eval's default: ours runs exactly the
        # runtime native runs (and so has the same shared-stack identity).
        "--env.taskset.nemo-gym-version", runtime.nemo_gym_version,
        "--env.taskset.python", str(runtime.python),
    ]  # fmt: skip
    if runtime.below_floor:
        cmd += ["--env.taskset.allow-python-below-floor", "True"]
    if private_stack:
        cmd += ["--env.taskset.shared-stack", "False"]
    return cmd


def env_with(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}


async def timed_vf_eval(cmd: list[str], outdir: Path, expected_ok: int) -> float:
    """Wall seconds of the vf-eval command `cmd` (results in `outdir`); raises unless it exits 0
    with `expected_ok` rollouts ok."""
    began = time.monotonic()
    proc = await start_child(
        *cmd,
        env={**os.environ, "SCRIPTED_KEY": "unused"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 1800)
    elapsed = time.monotonic() - began
    check_vf_eval(proc.returncode, out.decode(errors="replace"), outdir, expected_ok)
    return elapsed


def check_vf_eval(returncode: int | None, output: str, outdir: Path, expected_ok: int) -> None:
    """Raise unless a vf-eval run (exit status, output, results in `outdir`) exited 0 with
    `expected_ok` rollouts ok."""
    if returncode != 0:
        raise RuntimeError(f"vf-eval failed:\n{output[-3000:]}")
    (traces,) = outdir.glob("*/traces.jsonl")
    episodes = [json.loads(line) for line in traces.read_text().splitlines() if line]
    if (ok := sum(1 for e in episodes if e["ok"])) != expected_ok:
        raise RuntimeError(f"vf-eval: {ok}/{expected_ok} rollouts ok")


STACK_PROGRAMS = ("ng_run", "gcs_server")
"""The programs a NeMo Gym stack runs exactly one of: its orchestrator and Ray's GCS server."""


def count_stack_programs(*entries: str) -> dict[str, int]:
    """How many of each of `STACK_PROGRAMS` run among the live processes whose initial
    environment holds any of `entries` (`NAME=value`, as in `processes_with_env`).

    An `ng_run` counts once per orchestrator: a process whose parent runs `ng_run` too is not
    counted, because a child ng_run forks (a server's shell) carries ng_run's argv until it
    execs its own program. A `gcs_server` is a process whose argv[0] names it. A process that
    exits during the scan counts as whatever it was last seen as, or not at all.
    """
    pids = {pid for entry in entries for pid in processes_with_env(entry)}
    counts = dict.fromkeys(STACK_PROGRAMS, 0)
    for pid in pids:
        argv = argv_of(pid)
        if _runs_ng_run(argv) and not _runs_ng_run(argv_of(parent_of(pid))):
            counts["ng_run"] += 1
        if argv and argv[0].endswith("gcs_server"):
            counts["gcs_server"] += 1
    return counts


def _runs_ng_run(argv: list[str]) -> bool:
    # argv[0] is ng_run's interpreter when it runs as a script, argv[1] the script.
    return any(arg.endswith("/ng_run") for arg in argv[:2])
