"""NeMo Gym's container environments, natively and through nemo-gym-env, in one run:
`uv run python -m benchmarks.containers [--env ENV ...] [--side native|ours ...] [--levels 1,2,4]`

Each container environment of the hand-made task kit (`containers.kit.make_tasks`: swebench_pro
`tinycalc`, terminal_bench_2_1 `wordstats`, swe_next `textkit`) runs OpenCode inside the task's
docker container, against the fixer policy (`policies.fixer`). Its row is duplicated per case,
the problem tagged with the case (so the fixer tells the rows apart), and each case has its own
fixer entry: case 0 gets the right fix (NeMo Gym's reward 1.0), case 1 a real but useless edit
(0.0). Both sides get the same rows, images, NeMo Gym configs and fixer table, and the same timed
batches: per level `c` of `--levels`, every row `c` times with `c` rollouts in flight (rollouts
per minute, median seconds per rollout, the host's CPU busy share and load average over the
batch; level 1 first, its rollouts one at a time give the phases).

- `native`: plain NeMo Gym 0.7 as a user runs it. `gym env start` with NeMo Gym's pairing
  (`benchmarks/<...>/opencode.yaml`), the docker provider config, the kit's override, and a
  native override (`sandbox.docker.create.network: host`, so the container reaches the
  127.0.0.1 model server; the agent's `artifacts_dir` in the run's folder); `policy_model` is
  NeMo Gym's own `openai_model` on the env.yaml keys, pointing at the fixer. Each rollout is the
  row posted to the environment's `/run` (what `gym eval run` posts); its phases come from
  `/run`'s times and the times the fixer saw the calls (`verifiers_nemogym.phases`, no proxy:
  a call's hop is in `tools`). The stack is stopped by our supervisor. Every container NeMo
  Gym's docker provider creates also gets a label of this run (its `extra_run_args`), so the
  ones left afterwards, and only those, are counted, then removed.
- `ours`: nemo-gym-env's environment (`load_environment` with the pairing, docker.yaml and the
  kit's override as `config_paths`, the rows, the agent; what `vf-eval nemo-gym-env` runs)
  serving its own stack, each rollout `env.run_episode` with the fixer as the model; phases from
  the trace (`trace.info["nemo_gym_phases"]`), `other` the wall time beyond `/run`; the
  containers of its stack left afterwards are counted.

Writes `benchmarks/results/<date>-containers.json` (or `-o`); `table()`, `phase_table()` and
`rate_table()` render the docs' tables from it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from benchmarks.common import model_context, private_env, timed_serving
from benchmarks.harnesses import NativeHarnessStack, _post_run, report_head
from verifiers_nemogym.containers import docker
from verifiers_nemogym.containers.kit import KitTask, TaskKit, make_tasks
from verifiers_nemogym.containers.sandbox import PROVIDER_CONFIG, STACK_LABEL
from verifiers_nemogym.errors import StackError
from verifiers_nemogym.nemo.venv import NeMoGymVenv, ensure_venv
from verifiers_nemogym.phases import PHASES, rollout_phases
from verifiers_nemogym.policies.fixer import FixerPolicy, FixTask
from verifiers_nemogym.util import cache_root

RESULTS = Path(__file__).with_name("results")
NEMO_GYM_VERSION = "0.7.0"
MODEL = "fixer"
"""`policy_model_name` natively, `-m` through vf-eval (the fixer accepts any)."""
POLICY_KEY = "fixer-bench-credential"
"""`policy_api_key` natively (the fixer checks none)."""
CASES = (True, False)
"""Per environment: case 0 fixed right (reward 1.0), case 1 with a useless edit (0.0)."""
AGENTS = "responses_api_agents"
DOCKER_CONFIG = PROVIDER_CONFIG.format(name="docker")
RUN_LABEL = "vf-nemogym.bench-run"
"""Docker label (`<RUN_LABEL>=<uuid>`) the native side adds to the containers of its run."""


class NativeContainerStack(NativeHarnessStack):
    """The native stack (`NativeHarnessStack`) for container environments: none of our container
    handling (network, door, labels) and no pairing waiver; NeMo Gym's docker provider runs the
    containers as the user's configs say."""

    async def _prepare_containers(self) -> Path | None:
        return None

    def _model_type_restrictions(self) -> dict[str, list[str]]:
        return {}


def agent_of(runtime: NeMoGymVenv, task: KitTask) -> str:
    """The agent instance NeMo Gym's pairing of `task` runs (the one `responses_api_agents`
    block of its shipped config)."""
    names = []
    for path in task.config_paths:
        config = yaml.safe_load((runtime.site_packages / path).read_text()) or {}
        agents = [k for k, v in config.items() if isinstance(v, dict) and AGENTS in v]
        names += agents
    if len(names) != 1:
        raise RuntimeError(f"{task.env}: expected one agent in {task.config_paths}, found {names}")
    return names[0]


def case_rows(task: KitTask, agent: str, path: Path) -> list[FixTask]:
    """The task's row once per case (`CASES`), its problem tagged with the case and naming
    `agent`, written to `path`; the fixer's table in the same order (index = case)."""
    row = json.loads(task.rows.read_text().splitlines()[0])
    quoted = json.dumps(task.fix.key)[1:-1]
    table, lines = [], []
    for i in range(len(CASES)):
        tagged = f"{task.fix.key} (case {i})"
        text = json.dumps(row).replace(quoted, json.dumps(tagged)[1:-1])
        if json.dumps(tagged)[1:-1] not in text:
            raise RuntimeError(f"{task.env}: the row does not quote the fixer's key")
        tagged_row = json.loads(text) | {
            "agent_ref": {"type": "responses_api_agents", "name": agent}
        }
        lines.append(json.dumps(tagged_row))
        table.append(replace(task.fix, key=tagged, name=f"{task.fix.name}-{i}"))
    path.write_text("\n".join(lines) + "\n")
    return table


def wrong_cases() -> frozenset[int]:
    return frozenset(i for i, right in enumerate(CASES) if not right)


def expected_rewards() -> list[float]:
    return [1.0 if right else 0.0 for right in CASES]


def containers(label: str) -> set[str]:
    """IDs of the containers (any state) carrying docker label `label`."""
    return set(docker.run_docker("ps", "-aq", "--filter", f"label={label}").split())


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


LEVELS = (1, 2, 4)
"""Rollouts in flight (`-c`) of the timed batches; each batch runs every row that many times."""


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all the host's CPUs since boot (/proc/stat; idle and iowait are
    not busy)."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


@dataclass
class Rollout:
    """One timed rollout: wall-clock start and end (seconds), its case, its reward, and (ours)
    the phases on its trace."""

    began: float
    ended: float
    case: int
    reward: float
    phases: dict[str, float] | None = None


async def timed_levels(
    one: Callable[[int], Awaitable[Rollout]], cases: int, levels: tuple[int, ...]
) -> tuple[dict[str, Any], list[Rollout]]:
    """For each level `c` of `levels`, every case run `c` times with `c` rollouts in flight
    (`one(case)` runs one): rollouts per minute, median seconds per rollout, the rewards, the
    host's CPU busy share and load average over the batch. Also the rollouts of level 1."""
    out: dict[str, Any] = {}
    first: list[Rollout] = []
    for level in levels:
        gate = asyncio.Semaphore(level)

        async def limited(case: int, gate: asyncio.Semaphore = gate) -> Rollout:
            async with gate:
                return await one(case)

        order = [case for _ in range(level) for case in range(cases)]
        load_before, (busy0, total0), t0 = load(), cpu_times(), time.time()
        rollouts = await asyncio.gather(*(limited(case) for case in order))
        wall = time.time() - t0
        busy1, total1 = cpu_times()
        per_case: list[list[float]] = [[] for _ in range(cases)]
        for r in rollouts:
            per_case[r.case].append(r.reward)
        out[str(level)] = {
            "rollouts": len(rollouts),
            "wall_s": round(wall, 1),
            "per_minute": round(len(rollouts) * 60 / wall, 2),
            "s_per_rollout": round(statistics.median(r.ended - r.began for r in rollouts), 2),
            "rollout_s": [round(r.ended - r.began, 2) for r in rollouts],
            "timed_rewards": [[per_case[i][k] for i in range(cases)] for k in range(level)],
            "cpu_busy": round((busy1 - busy0) / max(total1 - total0, 1.0), 3),
            "load_before": load_before,
            "load_after": load(),
        }
        if level == levels[0]:
            first = list(rollouts)
    return out, first


def median_phases(rollouts: list[Rollout]) -> dict[str, float]:
    """Medians over `rollouts` of their phases (`PHASES`, `run`), the wall time (`wall`) and
    what the wall time holds beyond NeMo Gym's `/run` (`other`: verifiers' own work, ours)."""
    phased = [r for r in rollouts if r.phases is not None]
    if not phased:
        return {}
    out = {k: statistics.median(float(r.phases[k]) for r in phased) for k in (*PHASES, "run")}  # type: ignore[index]
    out["wall"] = statistics.median(r.ended - r.began for r in phased)
    out["other"] = statistics.median(r.ended - r.began - float(r.phases["run"]) for r in phased)  # type: ignore[index]
    return {k: round(v, 2) for k, v in out.items()}


def _side(
    levels: dict[str, Any], first: list[Rollout], log: list[Any], cases: int
) -> dict[str, Any]:
    timed = [rewards for level in levels.values() for rewards in level["timed_rewards"]]
    return {
        "rewards": timed[0],
        "timed_rewards": timed,
        "s_per_rollout": levels[min(levels, key=int)]["s_per_rollout"],
        "levels": levels,
        "phases": median_phases(first),
        "policy_calls": {"total": len(log)},
        "calls_by_case": _calls_by_case(log, cases),
    }


def _native_phases(rollouts: list[Rollout], log: list[Any]) -> None:
    """Native rollouts one at a time: their phases from `/run`'s times and the times the fixer
    saw each call (no proxy to time a call's hop: `model` is 0, the hop is in `tools`)."""
    for r in rollouts:
        seen = [(c.at, c.at) for c in log if r.began <= c.at <= r.ended]
        r.phases = {k: float(v) for k, v in rollout_phases(r.began, r.ended, seen).items()}


RAY_NODE_TIMEOUT = "The current node timed out during startup"
"""Ray's error when its node does not register within its fixed 30 s (a loaded machine)."""


async def _start_native(
    runtime: NeMoGymVenv, configs: list[Path], policy: FixerPolicy, workdir: Path
) -> NativeContainerStack:
    """The native stack, started; a start that fails on Ray's node timeout is tried again (up to
    3 times, as nemo-gym-env's own stack does on a loaded machine)."""
    for attempt in range(3):
        stack = NativeContainerStack(
            runtime, configs, policy_host=policy.host, policy_port=policy.port,
            workdir=workdir, start_timeout=1800, overrides=[],
        )  # fmt: skip
        try:
            await stack.start()
            return stack
        except StackError as e:
            if RAY_NODE_TIMEOUT not in str(e) or attempt == 2:
                raise
            print(f"native stack start {attempt + 1}/3: Ray's node timed out; again", flush=True)
    raise AssertionError("unreachable")


async def run_native(
    runtime: NeMoGymVenv, task: KitTask, agent: str, rows: Path, table: list[FixTask],
    levels: tuple[int, ...],
) -> dict[str, Any]:  # fmt: skip
    """`task`'s environment on plain NeMo Gym (module contract)."""
    site = runtime.site_packages
    openai_model = site / "responses_api_models/openai_model/configs/openai_model.yaml"
    run_label = f"{RUN_LABEL}={uuid.uuid4().hex}"
    load_before = load()
    lines = [json.loads(line) for line in rows.read_text().splitlines() if line]
    try:
        async with FixerPolicy(tasks=table, wrong=wrong_cases()) as policy:
            with tempfile.TemporaryDirectory(prefix="containers-native-") as tmp:
                native = Path(tmp, "native.yaml")
                impl = {"opencode_sandboxed_agent": {"artifacts_dir": str(Path(tmp, "artifacts"))}}
                create = {"network": "host", "extra_run_args": ["--label", run_label]}
                native.write_text(
                    yaml.safe_dump(
                        {"sandbox": {"docker": {"create": create}}, agent: {AGENTS: impl}}
                    )
                )
                configs = [site / p for p in task.config_paths]
                configs += [site / DOCKER_CONFIG, task.override, native, openai_model]
                workdir = Path(tmp, "stack")
                workdir.mkdir()
                env_yaml = {"policy_base_url": policy.base_url, "policy_api_key": POLICY_KEY,
                            "policy_model_name": policy.model_id}  # fmt: skip
                (workdir / "env.yaml").write_text(yaml.safe_dump(env_yaml))
                began = time.monotonic()
                stack = await _start_native(runtime, configs, policy, workdir)
                try:
                    start_s = time.monotonic() - began
                    url = stack.run_urls[agent]
                    timeout = aiohttp.ClientTimeout(total=1800)
                    async with aiohttp.ClientSession(timeout=timeout) as http:

                        async def one(case: int) -> Rollout:
                            t0 = time.time()
                            reward = await _post_run(http, url, lines[case])
                            return Rollout(t0, time.time(), case, reward)

                        measured, first = await timed_levels(one, len(table), levels)
                finally:
                    await stack.stop()
            log = policy.log
    finally:
        left = containers(run_label)
        if left:
            docker.run_docker("rm", "-f", *sorted(left))
    _native_phases(first, log)
    return {
        **_side(measured, first, log, len(table)),
        "start_s": round(start_s, 1),
        "containers_left": len(left),
        "load_before": load_before,
        "load_after": load(),
    }


def _calls_by_case(log: list[Any], cases: int) -> list[dict[str, int]]:
    """Per case, how many fixer calls answered with the fix and with the final message."""
    out = [{"fix": 0, "final": 0} for _ in range(cases)]
    for call in log:
        if call.task is not None and call.step in ("fix", "final"):
            out[call.task][call.step] += 1
    return out


async def run_ours(
    runtime: NeMoGymVenv, task: KitTask, agent: str, rows: Path, table: list[FixTask],
    levels: tuple[int, ...],
) -> dict[str, Any]:  # fmt: skip
    """`task`'s environment through nemo-gym-env (module contract)."""

    configs = [*task.config_paths, DOCKER_CONFIG, str(task.override)]
    load_before = load()
    async with FixerPolicy(tasks=table, wrong=wrong_cases()) as policy:
        env = private_env(runtime, config_paths=configs, jsonl_path=str(rows), agent=agent)
        tasks = list(env.taskset)
        ctx = model_context(MODEL, policy.base_url)
        async with timed_serving(env) as start_s:
            marker = env.stack_marker

            async def one(case: int) -> Rollout:
                t0 = time.time()
                episode = await env.run_episode(tasks[case], ctx)
                (trace,) = episode.traces
                if trace.errors:
                    raise RuntimeError(f"a rollout failed: {trace.errors[0].message[:1000]}")
                phases = {k: float(v) for k, v in trace.info["nemo_gym_phases"].items()}
                return Rollout(t0, time.time(), case, float(trace.reward), phases)

            measured, first = await timed_levels(one, len(table), levels)
        log = policy.log
    left = containers(f"{STACK_LABEL}={marker}") if marker else set()
    return {
        **_side(measured, first, log, len(table)),
        "start_s": round(start_s, 1),
        "containers_left": len(left),
        "load_before": load_before,
        "load_after": load(),
    }


SIDES = {"native": run_native, "ours": run_ours}


async def measure(
    envs: list[str] | None, sides: list[str], levels: tuple[int, ...], path: Path
) -> dict[str, Any]:
    """The result (module contract), also written to `path` after each side (a run cut short
    keeps what it measured)."""
    runtime = ensure_venv(NEMO_GYM_VERSION, allow_below_floor=True)
    kit: TaskKit = await asyncio.to_thread(make_tasks, cache_root() / "bench-containers-kit")
    chosen = list(kit.tasks) if envs is None else [kit.task(env) for env in envs]
    out: dict[str, Any] = {
        **report_head(runtime),
        "cases": ["right" if right else "wrong" for right in CASES],
        "expected_rewards": expected_rewards(),
        "levels": list(levels),
        "cpus": os.cpu_count(),
        "envs": {},
    }
    with tempfile.TemporaryDirectory(prefix="containers-rows-") as folder:
        for task in chosen:
            agent = agent_of(runtime, task)
            rows = Path(folder, f"{task.env}.jsonl")
            table = case_rows(task, agent, rows)
            entry: dict[str, Any] = {
                "task": task.name,
                "image": task.image,
                "agent": agent,
                "config_paths": [*task.config_paths, DOCKER_CONFIG, "<kit override>"],
            }
            for side in sides:
                try:
                    entry[side] = await SIDES[side](runtime, task, agent, rows, table, levels)
                except Exception as e:  # one side failing is a result, not the end
                    entry[side] = {"error": f"{type(e).__name__}: {str(e)[-3000:]}"}
                print(f"{task.env} {side}: {json.dumps(entry[side])[:600]}", flush=True)
                out["envs"][task.env] = entry
                path.write_text(json.dumps(out, indent=2) + "\n")
    return out


def _rewards(side: dict[str, Any]) -> str:
    if "rewards" not in side:
        return "error"
    return ", ".join(f"{r:g}" for r in side["rewards"])


def _seconds(side: dict[str, Any]) -> str:
    return f"{side['s_per_rollout']:.1f}" if "s_per_rollout" in side else "error"


def table(result: dict[str, Any]) -> list[str]:
    """The markdown table docs/containers.md quotes: per environment, the per-row rewards (in row
    order: the right fix, then the useless edit) and the median seconds per rollout one at a
    time, native and ours."""
    lines = [
        "| environment | rewards native | rewards ours | s/rollout native | s/rollout ours |",
        "|---|---|---|---|---|",
    ]
    for name, entry in result["envs"].items():
        native, ours = entry.get("native", {}), entry.get("ours", {})
        lines.append(
            f"| {name} | {_rewards(native)} | {_rewards(ours)} | "
            f"{_seconds(native)} | {_seconds(ours)} |"
        )
    return lines


def phase_table(result: dict[str, Any]) -> list[str]:
    """Per environment and side, the median phases of a rollout run one at a time, in seconds:
    the rollout's wall time, `/run`'s start, model, tools and finish (`verifiers_nemogym.
    phases`), and the rest of the wall time (`other`: verifiers' own work around `/run`)."""
    lines = [
        "| environment | side | s/rollout | start | model | tools | finish | other |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in result["envs"].items():
        for side in ("native", "ours"):
            p = entry.get(side, {}).get("phases")
            if not p:
                continue
            cells = [f"{p[k]:.1f}" for k in ("wall", *PHASES, "other")]
            lines.append(f"| {name} | {side} | {' | '.join(cells)} |")
    return lines


def rate_table(result: dict[str, Any]) -> list[str]:
    """Per environment and level (`-c`), rollouts per minute native and ours, their ratio, and
    the host's CPU busy share during each batch (all processes of the machine)."""
    lines = [
        "| environment | -c | per minute native | per minute ours | ours / native "
        "| CPU busy native | CPU busy ours |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, entry in result["envs"].items():
        native = entry.get("native", {}).get("levels", {})
        ours = entry.get("ours", {}).get("levels", {})
        for level in result.get("levels", []):
            n, o = native.get(str(level)), ours.get(str(level))
            if n is None or o is None:
                continue
            lines.append(
                f"| {name} | {level} | {n['per_minute']:.1f} | {o['per_minute']:.1f} | "
                f"{o['per_minute'] / n['per_minute']:.2f} | {n['cpu_busy']:.0%} | "
                f"{o['cpu_busy']:.0%} |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--env", action="append", default=[], help="an environment of the kit")
    parser.add_argument("--side", action="append", choices=sorted(SIDES), default=[])
    parser.add_argument(
        "--levels", default=",".join(map(str, LEVELS)),
        help="rollouts in flight per timed batch, comma-separated, the first 1 (default 1,2,4)",
    )  # fmt: skip
    parser.add_argument("-o", "--output", type=Path, default=None)
    args = parser.parse_args()
    try:
        levels = tuple(int(x) for x in args.levels.split(","))
    except ValueError:
        parser.error(f"--levels: not comma-separated integers: {args.levels!r}")
    if not levels or levels[0] != 1 or min(levels) < 1:
        parser.error("--levels must start with 1 (the phases are measured one at a time)")
    sides = args.side or ["native", "ours"]
    day = datetime.date.today().isoformat()
    path = args.output or RESULTS / f"{day}-containers.json"
    result = asyncio.run(measure(args.env or None, sides, levels, path))
    print("\n".join([*table(result), "", *phase_table(result), "", *rate_table(result)]))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
