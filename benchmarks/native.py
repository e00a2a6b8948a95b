"""The native NeMo Gym path for the side-by-side figures, and start-up phase timing.

Native means NeMo Gym's own commands from the runtime venv, on the same rows and policy:
`ng_run` (`gym env start` on >= 0.7) with NeMo Gym's own Ray start and readiness poll (our
supervisor and log capture around it, so nothing can be orphaned; they add no work to the
start), and `ng_collect_rollouts` (`gym eval run --no-serve` on >= 0.7).
The policy is the scripted policy registered as `policy_model` directly, without our proxy.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

from benchmarks.common import ENV, ROWS, cpu_s, start_child
from verifiers_nemogym.containers.seam import StackSandboxes
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.stack import NeMoGymStack
from verifiers_nemogym.nemo.supervisor import argv_of, processes_with_marker
from verifiers_nemogym.nemo.venv import NeMoGymVenv

# Lines of ng_run's log that open and close its phases (nemo_gym/cli/env.py, server_utils.py).
_RAY_BEGIN = re.compile(r"NeMo Gym is starting a new Ray cluster|Connecting to Ray cluster")
_HEAD_WAIT = re.compile(r"Waiting for head server to spin up")


def native_stack(runtime: NeMoGymVenv, config_paths: list[Path], policy_port: int) -> NeMoGymStack:
    """A stack run the native way: `ng_run` starts Ray and polls readiness itself."""
    return NeMoGymStack(
        runtime,
        config_paths,
        policy_host="127.0.0.1",
        policy_port=policy_port,
        fast_start=False,
        sandboxes=StackSandboxes,
    )


async def timed_start(stack: NeMoGymStack) -> dict[str, float]:
    """Start `stack`; seconds from start() to each phase boundary seen in ng_run's log:
    `cli` (ng_run imported and parsed its config), `ray` (Ray up), `servers` (venvs checked or
    built, servers imported and answering), `total`, and `cpu_s`: CPU seconds the stack's
    processes used until then (on a shared machine, less noisy than wall time), split into
    `cpu_ray_s`, `cpu_servers_s` and `cpu_ng_run_s` (see `_kind`)."""
    began = time.monotonic()
    seen: dict[str, float] = {}

    cpu: dict[int, float] = {}
    kinds: dict[int, str] = {}

    def sample_cpu() -> None:
        # The stack's processes are the supervisor's descendants, not ours (no rusage): sample
        # each marked process's CPU time; processes that end between samples are missed.
        for pid in processes_with_marker(stack.marker) + ([stack._proc.pid] if stack._proc else []):
            used = cpu_s(pid)
            if used is not None:
                cpu[pid] = max(cpu.get(pid, 0.0), used)
                kinds.setdefault(pid, _kind(pid))

    async def watch() -> None:
        while True:
            sample_cpu()
            log = stack.log_path if stack.workdir is not None else None
            text = log.read_text(errors="replace") if log is not None and log.exists() else ""
            for name, pattern in (("cli", _RAY_BEGIN), ("ray", _HEAD_WAIT)):
                if name not in seen and pattern.search(text):
                    seen[name] = time.monotonic() - began
            await asyncio.sleep(0.05)

    watcher = asyncio.ensure_future(watch())
    try:
        await stack.start()
    finally:
        watcher.cancel()
    total = time.monotonic() - began
    sample_cpu()
    cli = seen.get("cli", 0.0)
    ray = seen.get("ray", cli)
    return {
        "total": total,
        "cli": cli,
        "ray": ray - cli,
        "servers": total - ray,
        "cpu_s": sum(cpu.values()),
        **{
            f"cpu_{kind}_s": sum(used for pid, used in cpu.items() if kinds[pid] == kind)
            for kind in ("ray", "servers", "ng_run")
        },
    }


def _kind(pid: int) -> str:
    """Which part of a stack a process is: `ray` (Ray's daemons: GCS, raylet, dashboard and
    its agents, monitors), `servers` (NeMo Gym's server processes), or `ng_run` (ng_run, its
    shell wrappers and our supervisor)."""
    if not (argv := argv_of(pid)):
        return "ng_run"
    line = " ".join(argv)
    if argv[0].startswith("ray::") or "/ray/" in line or "raylet" in line or "gcs_server" in line:
        return "ray"
    return "servers" if "app.py" in argv[-3:] or argv[0].endswith("app.py") else "ng_run"


def rows_file(runtime: NeMoGymVenv, folder: Path) -> Path:
    """The first ROWS example rows of ENV written to `folder/rows.jsonl` (native's input)."""
    lines = Catalog(runtime).env(ENV).dataset("example").read_text().splitlines()
    rows = folder / "rows.jsonl"
    rows.write_text("\n".join([line for line in lines if line.strip()][:ROWS]) + "\n")
    return rows


async def collect_rollouts(
    runtime: NeMoGymVenv,
    stack: NeMoGymStack,
    agent: str,
    rows: Path,
    output: Path,
    *,
    repeats: int,
    in_flight: int,
) -> None:
    """NeMo Gym's own rollout collection on a running stack (`collect_command`); raises unless
    every rollout was written with a reward and none is masked (`check_collected`)."""
    what, command = collect_command(
        runtime, stack, agent, rows, output, repeats=repeats, in_flight=in_flight
    )
    proc = await start_child(
        *command,
        cwd=output.parent,
        env=runtime.env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 900)
    check_collected(what, proc.returncode, out.decode(errors="replace"), rows, output, repeats)


def collect_command(
    runtime: NeMoGymVenv,
    stack: NeMoGymStack,
    agent: str,
    rows: Path,
    output: Path,
    *,
    repeats: int,
    in_flight: int,
) -> tuple[str, list[str]]:
    """(its name, the command) of NeMo Gym's own rollout collection of `rows` x `repeats`
    through `agent` on `stack`, results to `output`; run it in `output`'s folder with
    `runtime.env()`.

    NeMo Gym 0.7 documents `gym eval run --no-serve` (`ng_collect_rollouts` is its deprecated
    shim): it posts each row's `/run` to the environment server fronting `agent`. Its defaults
    are kept (aggregate metrics and rollout health check after collection): that is what a
    NeMo Gym user runs.
    """
    head = stack.head_url.removeprefix("http://")
    host, port = head.rsplit(":", 1)
    if stack.features.gym_cli:
        what, command = "gym eval run", [str(runtime.bin("gym")), "eval", "run", "--no-serve"]
    else:
        what, command = "ng_collect_rollouts", [str(runtime.bin("ng_collect_rollouts"))]
    return what, [
        *command,
        f"+agent_name={agent}",
        f"+input_jsonl_fpath={rows}",
        f"+output_jsonl_fpath={output}",
        f"+num_repeats={repeats}",
        f"+num_samples_in_parallel={in_flight}",
        f"+head_server.host={host}",
        f"+head_server.port={port}",
    ]


def check_collected(
    what: str, returncode: int | None, out: str, rows: Path, output: Path, repeats: int
) -> None:
    """Raise unless the collection `what` exited 0 and wrote every row's `repeats` rollouts to
    `output` with a reward, none masked (0.7's mark of an infrastructure failure)."""
    wanted = repeats * sum(1 for line in rows.read_text().splitlines() if line.strip())
    lines = output.read_text().splitlines() if output.exists() else []
    results = [json.loads(line) for line in lines if line.strip()]
    # A rollout counts if it was scored: a numeric reward and not masked.
    got = sum(
        1 for r in results if isinstance(r.get("reward"), int | float) and not r.get("mask_sample")
    )
    if returncode != 0 or got != wanted:
        raise RuntimeError(
            f"{what} exit {returncode}, {got}/{wanted} rollouts "
            f"({len(results) - got} unscored or masked):\n" + out[-3000:]
        )
