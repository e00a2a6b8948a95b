"""NeMo Gym's container environments, natively and through nemo-gym-env, in one run:
`uv run python -m benchmarks.containers [--env ENV ...] [--side native|ours ...]
[--provider docker|opensandbox ...] [--levels 1,2,4] [--repeats 2]`

Each container environment of the hand-made task kit (`containers.kit.make_tasks`: swebench_pro
`tinycalc`, terminal_bench_2_1 `wordstats`, swe_next `textkit`) runs OpenCode inside the task's
docker container, against the fixer policy (`policies.fixer`). Its row is duplicated per case,
the problem tagged with the case (so the fixer tells the rows apart), and each case has its own
fixer entry: case 0 gets the right fix (NeMo Gym's reward 1.0), case 1 a real but useless edit
(0.0). Both sides get the same rows, images, NeMo Gym configs and fixer table, and the same timed
batches, run interleaved: both sides' stacks are up at once (started one after the other, each
start timed), then per level `c` of `--levels` (level 1 first: its rollouts, one at a time,
give the phases, each rollout's kept and their means reported) `--repeats` rounds, each round
one batch per side, the sides one after the other and their order turned every round (native,
ours; ours, native; ...), so each side's batch meets the load the other's met just before or
after it. A batch runs every row `c` times with `c`
rollouts in flight and records its wall time, rollouts per minute, the seconds of each rollout,
the host's CPU busy share over it (`/proc/stat`, every process of the machine) and the 1-minute
load average before and after it; a level's ratio ours / native is the median of the rounds'
ratios (`ratio`).

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

`--provider opensandbox` runs the same two sides with NeMo Gym's shipped `opensandbox.yaml` in
place of docker.yaml, as `native-opensandbox` and `ours-opensandbox` (`--provider docker` is the
default; both flags run all four sides, interleaved alike). The benchmark starts the real
`opensandbox-server` (`benchmarks.opensandbox_server`: loopback, an API key, the stand-in execd
image) and gives both sides its address and key in `OPENSANDBOX_DOMAIN` / `OPENSANDBOX_API_KEY`
(the environment, never a command line); at the end it checks the server lists no sandbox
(deleting and counting any), then stops it.
- `native-opensandbox`: as `native`, but the sandboxes sit on docker's default bridge, so NeMo
  Gym's `openai_model` server (what OpenCode in the sandbox calls) listens on the bridge's
  gateway address instead of 127.0.0.1 (the fixer stays on loopback: only that server calls
  it); the agent gets one uvicorn worker (as `ours-opensandbox`), and its sandboxes carry the
  run's metadata `<RUN_LABEL>=<uuid>` (a docker label), by which what is left is counted, then
  deleted through the server and docker.
- `ours-opensandbox`: as `ours`, with `allow_unisolated_containers` (no egress image here) and
  one uvicorn worker per agent (as tests/stack/containers/test_opensandbox.py: NeMo Gym's 4
  workers are restarted for ever on a loaded 2-core machine); the door listens on the bridge's
  gateway.
Each environment's entry gets `parity`: the sides with rewards and whether their per-row rewards
are all equal.

Ctrl-C stops the run: every side's stack and containers are cleaned up on the way out, and an
error a cleanup raises then (a rollout cut short) ends the run too, never a side's result after
which it would go on (`cancelling`).

Writes `benchmarks/results/<date>-containers.json` (or `-o`); `table()`, `phase_table()` and
`rate_table()` render the docs' tables from it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from benchmarks.common import model_context, private_env, timed_serving
from benchmarks.harnesses import NativeHarnessStack, _post_run, report_head
from benchmarks.opensandbox_server import SERVER, OpenSandboxServer
from verifiers_nemogym.containers import docker, images
from verifiers_nemogym.containers.kit import KitTask, TaskKit, make_tasks
from verifiers_nemogym.containers.providers.opensandbox import STACK_KEY, bridge_gateway
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
"""Docker label (`<RUN_LABEL>=<uuid>`) the native side adds to the containers of its run (with
OpenSandbox: sandbox metadata, which the server makes a docker label)."""
PROVIDERS = ("docker", "opensandbox")
"""NeMo Gym sandbox providers a side can run its containers with (`--provider`)."""
OPENSANDBOX_ENV = ("OPENSANDBOX_DOMAIN", "OPENSANDBOX_API_KEY")
"""What NeMo Gym's shipped opensandbox.yaml reads (the server's address and key)."""


@dataclass(frozen=True)
class Sandboxes:
    """Where a side's containers run: NeMo Gym's sandbox provider `provider` (its shipped config)
    and, for `opensandbox`, the server the benchmark started."""

    provider: str = "docker"
    server: OpenSandboxServer | None = None

    @property
    def config(self) -> str:
        """The provider's config path in the NeMo Gym install."""
        return PROVIDER_CONFIG.format(name=self.provider)


DOCKER_SANDBOXES = Sandboxes()


def side_name(side: str, provider: str) -> str:
    """A side's name in the result: `native`/`ours` for docker (as before providers), else
    `<side>-<provider>`."""
    return side if provider == "docker" else f"{side}-{provider}"


def side_kind(name: str) -> tuple[str, str]:
    """(`native` or `ours`, provider) of a side's name (`side_name`'s inverse)."""
    side, _, provider = name.partition("-")
    return side, provider or "docker"


def one_worker(agent: str, path: Path) -> Path:
    """A config giving `agent` one uvicorn worker (NeMo Gym's pairing asks for 4: uvicorn kills a
    worker not up within 5 s, and importing the sandbox clients takes longer than that on a
    loaded 2-core machine, so the workers were restarted for ever). Its path."""
    path.write_text(
        yaml.safe_dump({agent: {AGENTS: {"opencode_sandboxed_agent": {"num_workers": 1}}}})
    )
    return path


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
REPEATS = 2
"""Rounds per level; each round runs one batch per side, the sides one after the other."""


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


@dataclass
class Running:
    """A side with its stack up: `one(case)` runs one rollout of case `case`'s row; `start_s` is
    the seconds the stack took to start, `policy` the side's own fixer (its call log), `left`
    the containers of the side found after its stack stopped (set on the way out; None before)."""

    one: Callable[[int], Awaitable[Rollout]]
    start_s: float
    policy: FixerPolicy
    load_before: list[float]
    left: int | None = None


async def batch(
    one: Callable[[int], Awaitable[Rollout]], cases: int, level: int
) -> tuple[dict[str, Any], list[Rollout]]:
    """Every case run `level` times with `level` rollouts in flight (`one(case)` runs one): the
    batch's wall time, rollouts per minute, median seconds per rollout, the rewards, the host's
    CPU busy share and its load average before and after; and the rollouts."""
    gate = asyncio.Semaphore(level)

    async def limited(case: int) -> Rollout:
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
    summary = {
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
    return summary, list(rollouts)


def level_totals(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """One level of a side over its rounds (`batches`, in round order, each `batch`'s summary
    with its `repeat`): rollouts per minute over all of them, the median seconds per rollout, the
    rewards, the CPU busy share weighted by wall time, the load before the first and after the
    last; and the batches themselves (the ratios are taken per round from them)."""
    wall = sum(b["wall_s"] for b in batches)
    rollouts = sum(b["rollouts"] for b in batches)
    seconds = [s for b in batches for s in b["rollout_s"]]
    return {
        "rollouts": rollouts,
        "wall_s": round(wall, 1),
        "per_minute": round(rollouts * 60 / wall, 2),
        "s_per_rollout": round(statistics.median(seconds), 2),
        "rollout_s": seconds,
        "timed_rewards": [rewards for b in batches for rewards in b["timed_rewards"]],
        "cpu_busy": round(sum(b["cpu_busy"] * b["wall_s"] for b in batches) / wall, 3),
        "load_before": batches[0]["load_before"],
        "load_after": batches[-1]["load_after"],
        "batches": batches,
    }


Measured = dict[str, tuple[dict[str, Any], list[Rollout]] | str]
"""Per side: its levels (`level_totals`) and its rollouts of level 1, or the error that stopped
it."""


async def interleaved(
    sides: dict[str, Running], cases: int, levels: tuple[int, ...], repeats: int,
    save: Callable[[Measured], None] = lambda _: None,
) -> Measured:  # fmt: skip
    """Per level of `levels` (in order), `repeats` rounds; a round runs one `batch` per side,
    the sides one after the other, the order turned each round (native first, then ours first,
    ...), so each side's batch meets the load the other's met just before or after it. Per side:
    its levels (`level_totals`) and its rollouts of level 1 (one at a time: their phases), or
    the error that stopped it (the other side goes on). `save` gets what is measured so far
    after every batch (a run cut short keeps it)."""
    names = list(sides)
    done: dict[str, dict[str, list[dict[str, Any]]]] = {n: {} for n in names}
    first: dict[str, list[Rollout]] = {n: [] for n in names}
    failed: dict[str, str] = {}

    def so_far() -> Measured:
        out: Measured = {}
        for n in names:
            totals = {k: level_totals(v) for k, v in done[n].items()}
            out[n] = failed[n] if n in failed else (totals, first[n])
        return out

    for level in levels:
        for repeat in range(repeats):
            turn = repeat % len(names)
            order = [n for n in names[turn:] + names[:turn] if n not in failed]
            for position, name in enumerate(order):
                try:
                    summary, rollouts = await batch(sides[name].one, cases, level)
                except Exception as e:  # a side failing is a result, not the end
                    if cancelling():
                        raise
                    failed[name] = f"{type(e).__name__}: {str(e)[-3000:]}"
                    continue
                summary |= {"repeat": repeat, "position": position}
                done[name].setdefault(str(level), []).append(summary)
                if level == 1:
                    first[name] += rollouts
                print(
                    f"-c {level} round {repeat + 1}/{repeats} {name}: {summary['wall_s']} s, "
                    f"load {summary['load_before'][0]}",
                    flush=True,
                )
                save(so_far())
    return so_far()


def rollout_phases_of(r: Rollout) -> dict[str, float]:
    """One rollout's phases (`PHASES`, `run`), its wall time (`wall`) and what the wall time
    holds beyond NeMo Gym's `/run` (`other`: verifiers' own work, ours); empty without phases."""
    if r.phases is None:
        return {}
    out = {k: float(r.phases[k]) for k in (*PHASES, "run")}
    out["wall"] = r.ended - r.began
    out["other"] = out["wall"] - out["run"]
    return {k: round(v, 2) for k, v in out.items()}


def mean_phases(rollouts: list[Rollout]) -> dict[str, float]:
    """Means over `rollouts` of `rollout_phases_of` (means, unlike medians, add up as each
    rollout's phases do: the phases to `run`, `run` and `other` to `wall`)."""
    each = [p for p in map(rollout_phases_of, rollouts) if p]
    if not each:
        return {}
    return {k: round(statistics.fmean(p[k] for p in each), 2) for k in each[0]}


def _side(
    running: Running, levels: dict[str, Any], first: list[Rollout], cases: int
) -> dict[str, Any]:
    log = running.policy.log
    timed = [rewards for level in levels.values() for rewards in level["timed_rewards"]]
    return {
        "rewards": timed[0],
        "timed_rewards": timed,
        "s_per_rollout": levels[min(levels, key=int)]["s_per_rollout"],
        "levels": levels,
        "phases": mean_phases(first),
        "phases_of": "mean",
        "phases_each": [rollout_phases_of(r) for r in first],
        "policy_calls": {"total": len(log)},
        "calls_by_case": _calls_by_case(log, cases),
        "start_s": round(running.start_s, 1),
        "containers_left": running.left,
        "complete": running.left is not None,
        "load_before": running.load_before,
        "load_after": load(),
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


def native_override(
    agent: str, artifacts: Path, run_id: str, sandboxes: Sandboxes
) -> dict[str, Any]:
    """The native side's own config (module contract): docker's containers on the host's
    network with the run's label; OpenSandbox's sandboxes with the run's metadata, the agent on
    one worker, and NeMo Gym's `openai_model` server on docker's default bridge gateway (where
    the sandboxes reach it: they are on that bridge, and the server must not listen on every
    address)."""
    impl: dict[str, Any] = {"artifacts_dir": str(artifacts)}
    if sandboxes.provider == "docker":
        create = {"network": "host", "extra_run_args": ["--label", f"{RUN_LABEL}={run_id}"]}
        return {
            "sandbox": {"docker": {"create": create}},
            agent: {AGENTS: {"opencode_sandboxed_agent": impl}},
        }
    impl["num_workers"] = 1
    return {
        "sandbox": {"default_metadata": {RUN_LABEL: run_id}},
        agent: {AGENTS: {"opencode_sandboxed_agent": impl}},
        "policy_model": {"responses_api_models": {"openai_model": {"host": bridge_gateway()}}},
    }


def remove_left(sandboxes: Sandboxes, label: str) -> int:
    """Remove what of a run is left, found by docker label `label` (`key=value`), and with
    OpenSandbox first every sandbox its server lists with that metadata (deleted through the
    server, so its list is clean too); how many there were."""
    listed: set[str] = set()
    if sandboxes.server is not None:
        key, _, value = label.partition("=")
        for sandbox in sandboxes.server.sandboxes():
            if (sandbox.get("metadata") or {}).get(key) == value:
                listed.add(str(sandbox["id"]))
                sandboxes.server.call("DELETE", f"/v1/sandboxes/{sandbox['id']}")
    left = containers(label)
    if left:
        try:
            docker.run_docker("rm", "-f", *sorted(left))
        except StackError:
            # NeMo Gym's own teardown may be removing them right now (a rollout cut short:
            # "removal of container ... is already in progress"); what counts is that they go.
            if not _gone(label, REMOVAL_S):
                raise
    return max(len(listed), len(left))


REMOVAL_S = 60.0
"""Seconds a run's containers get to go once another removal of them is in progress."""


def _gone(label: str, seconds: float) -> bool:
    """Whether no container carries docker label `label` within `seconds` (polled)."""
    deadline = time.monotonic() + seconds
    while containers(label):
        if time.monotonic() > deadline:
            return False
        time.sleep(1)
    return True


def cancelling() -> bool:
    """Whether the running task is being cancelled (Ctrl-C: `asyncio.run` cancels the main
    task). An error raised then (a rollout's or a stack's cleanup cut short) is no side's
    result: taken as one, the run would go on after the user stopped it."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


@contextlib.asynccontextmanager
async def native_side(
    runtime: NeMoGymVenv, task: KitTask, agent: str, rows: Path, table: list[FixTask],
    sandboxes: Sandboxes = DOCKER_SANDBOXES,
) -> AsyncIterator[Running]:  # fmt: skip
    """`task`'s environment on plain NeMo Gym (module contract), its stack up while in the
    block; the containers of its run left afterwards are counted, then removed."""
    site = runtime.site_packages
    openai_model = site / "responses_api_models/openai_model/configs/openai_model.yaml"
    run_id = uuid.uuid4().hex
    run_label = f"{RUN_LABEL}={run_id}"
    load_before = load()
    lines = [json.loads(line) for line in rows.read_text().splitlines() if line]
    running: Running | None = None
    try:
        async with FixerPolicy(tasks=table, wrong=wrong_cases()) as policy:
            with tempfile.TemporaryDirectory(prefix="containers-native-") as tmp:
                native = Path(tmp, "native.yaml")
                override = native_override(agent, Path(tmp, "artifacts"), run_id, sandboxes)
                native.write_text(yaml.safe_dump(override))
                configs = [site / p for p in task.config_paths]
                configs += [site / sandboxes.config, task.override]
                # the native override last where it sets openai_model's own block (its host)
                tail = (
                    [native, openai_model]
                    if sandboxes.provider == "docker"
                    else [openai_model, native]
                )
                configs += tail
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

                        running = Running(one, start_s, policy, load_before)
                        yield running
                finally:
                    await stack.stop()
    finally:
        left = remove_left(sandboxes, run_label)
        if running is not None:
            running.left = left


def _calls_by_case(log: list[Any], cases: int) -> list[dict[str, int]]:
    """Per case, how many fixer calls answered with the fix and with the final message."""
    out = [{"fix": 0, "final": 0} for _ in range(cases)]
    for call in log:
        if call.task is not None and call.step in ("fix", "final"):
            out[call.task][call.step] += 1
    return out


@contextlib.asynccontextmanager
async def ours_side(
    runtime: NeMoGymVenv, task: KitTask, agent: str, rows: Path, table: list[FixTask],
    sandboxes: Sandboxes = DOCKER_SANDBOXES,
) -> AsyncIterator[Running]:  # fmt: skip
    """`task`'s environment through nemo-gym-env (module contract), its stack up while in the
    block; the containers of its stack left afterwards are counted."""
    configs = [*task.config_paths, sandboxes.config, str(task.override)]
    options: dict[str, Any] = {}
    label = STACK_LABEL
    load_before = load()
    running: Running | None = None
    marker = None
    try:
        async with contextlib.AsyncExitStack() as scope:
            if sandboxes.provider == "opensandbox":
                folder = Path(scope.enter_context(tempfile.TemporaryDirectory(prefix="ours-")))
                configs.append(str(one_worker(agent, folder / "workers.yaml")))
                # no egress image here: the sandboxes cannot be isolated (docs/containers.md)
                options["allow_unisolated_containers"] = True
                label = STACK_KEY
            policy = await scope.enter_async_context(FixerPolicy(tasks=table, wrong=wrong_cases()))
            env = private_env(
                runtime, config_paths=configs, jsonl_path=str(rows), agent=agent, **options
            )
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

                running = Running(one, start_s, policy, load_before)
                yield running
    finally:
        if running is not None and marker:
            running.left = len(containers(f"{label}={marker}"))


SIDES = {"native": native_side, "ours": ours_side}


def _error(e: BaseException) -> dict[str, str]:
    return {"error": f"{type(e).__name__}: {str(e)[-3000:]}"}


SIDE_STARTS = 4
"""Starts of a side's stack (each with its own retries) while Ray's node times out (a loaded
machine: Ray waits a fixed 30 s for it)."""


def results(measured: Measured, running: dict[str, Running], cases: int) -> dict[str, Any]:
    """Per side of `measured`, its result (module contract) or `{"error": ...}`; a side without
    a batch yet is left out."""
    out: dict[str, Any] = {}
    for side, got in measured.items():
        if isinstance(got, str):
            out[side] = {"error": got}
            continue
        by_level, first = got
        if not by_level:
            continue
        if side_kind(side)[0] == "native":
            _native_phases(first, running[side].policy.log)
        out[side] = _side(running[side], by_level, first, cases)
    return out


async def measure_env(
    runtime: NeMoGymVenv, task: KitTask, agent: str, rows: Path, table: list[FixTask],
    sides: list[str], levels: tuple[int, ...], repeats: int,
    save: Callable[[dict[str, Any]], None],
    backends: dict[str, Sandboxes] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Every side's stack up at once (their starts timed one after the other), then the
    `interleaved` batches; per side its result, or the error that stopped it. `save` gets the
    sides' results so far after every batch (`complete` false, containers left not counted).
    `sides` are `side_name`s; `backends` gives each provider's `Sandboxes` (docker's default)."""
    backends = backends or {"docker": DOCKER_SANDBOXES}
    out: dict[str, Any] = {}
    running: dict[str, Running] = {}
    measured: Measured = {}
    try:
        async with contextlib.AsyncExitStack() as stacks:
            for side in sides:
                for attempt in range(1, SIDE_STARTS + 1):
                    try:
                        kind, provider = side_kind(side)
                        cm = SIDES[kind](runtime, task, agent, rows, table, backends[provider])
                        running[side] = await stacks.enter_async_context(cm)
                        break
                    except Exception as e:  # one side failing is a result, not the end
                        if cancelling():
                            raise
                        out[side] = _error(e)
                        if RAY_NODE_TIMEOUT not in str(e) or attempt == SIDE_STARTS:
                            break
                        print(f"{side} start {attempt}/{SIDE_STARTS}: Ray's node timed out; again")
                        del out[side]
                print(f"{task.env} {side}: {json.dumps(out.get(side, 'up'))[:600]}", flush=True)
            if running:

                def partial(so_far: Measured) -> None:
                    save(out | results(so_far, running, len(table)))

                measured = await interleaved(running, len(table), levels, repeats, partial)
    except Exception as e:  # a stack that failed to stop: its side's result is that error
        if cancelling():
            raise
        for side in running:
            out[side] = _error(e)
        return out
    return out | results(measured, running, len(table))


def parity(entry: dict[str, Any], sides: list[str]) -> dict[str, Any]:
    """Of an environment's entry: the sides (of `sides`, in order) that have rewards, and
    whether their per-row rewards are all equal (None with fewer than two such sides)."""
    scored = [s for s in sides if "rewards" in entry.get(s, {})]
    rewards = {json.dumps(entry[s]["rewards"]) for s in scored}
    return {"sides": scored, "equal": len(rewards) == 1 if len(scored) > 1 else None}


@contextlib.contextmanager
def opensandbox_server(record: dict[str, Any]) -> Iterator[OpenSandboxServer]:
    """The real OpenSandbox server (`benchmarks.opensandbox_server`) up while in the block, its
    address and key in the environment NeMo Gym's opensandbox.yaml reads (both sides' stacks
    inherit it; restored afterwards). On the way out the sandboxes it still lists are counted
    into `record["sandboxes_left"]` and deleted through it, then it is stopped by its PID."""
    with tempfile.TemporaryDirectory(prefix="containers-opensandbox-") as folder:
        server = OpenSandboxServer(images.execd_image(), Path(folder))
        saved = {name: os.environ.get(name) for name in OPENSANDBOX_ENV}
        server.start()
        try:
            os.environ.update(OPENSANDBOX_DOMAIN=server.url, OPENSANDBOX_API_KEY=server.key)
            record["version"] = SERVER
            yield server
        finally:
            try:
                left = server.sandboxes()
                record["sandboxes_left"] = len(left)
                for sandbox in left:
                    server.call("DELETE", f"/v1/sandboxes/{sandbox['id']}")
            finally:
                server.stop()
                for name, value in saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value


async def measure(
    envs: list[str] | None, sides: list[str], levels: tuple[int, ...], repeats: int, path: Path
) -> dict[str, Any]:
    """The result (module contract), also written to `path` after each environment (a run cut
    short keeps what it measured). `sides` are `side_name`s; an OpenSandbox side's server is
    started here and stopped at the end (`opensandbox_server`)."""
    runtime = ensure_venv(NEMO_GYM_VERSION, allow_below_floor=True)
    kit: TaskKit = await asyncio.to_thread(make_tasks, cache_root() / "bench-containers-kit")
    chosen = list(kit.tasks) if envs is None else [kit.task(env) for env in envs]
    providers = sorted({side_kind(side)[1] for side in sides}, key=PROVIDERS.index)
    out: dict[str, Any] = {
        **report_head(runtime),
        "cases": ["right" if right else "wrong" for right in CASES],
        "expected_rewards": expected_rewards(),
        "levels": list(levels),
        "repeats": repeats,
        "interleaved": True,
        "cpus": os.cpu_count(),
        "envs": {},
    }
    if providers != ["docker"]:
        out["providers"] = providers
    with contextlib.ExitStack() as scope:
        backends = {"docker": DOCKER_SANDBOXES}
        if "opensandbox" in providers:
            record = out.setdefault("opensandbox_server", {})
            server = scope.enter_context(opensandbox_server(record))
            backends["opensandbox"] = Sandboxes("opensandbox", server)
        await _measure_envs(runtime, chosen, sides, levels, repeats, path, out, backends)
    if "opensandbox_server" in out:  # the server's count of what was left came at its stop
        path.write_text(json.dumps(out, indent=2) + "\n")
    return out


async def _measure_envs(
    runtime: NeMoGymVenv, chosen: list[KitTask], sides: list[str], levels: tuple[int, ...],
    repeats: int, path: Path, out: dict[str, Any], backends: dict[str, Sandboxes],
) -> None:  # fmt: skip
    """`measure`'s environments, one after the other, into `out["envs"]` (written to `path`)."""
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
            if "opensandbox" in backends:
                entry["opensandbox_config_paths"] = [
                    *task.config_paths, backends["opensandbox"].config, "<kit override>",
                ]  # fmt: skip

            def save(sides_so_far: dict[str, Any], env: str = task.env) -> None:
                out["envs"][env] = out["envs"][env] | sides_so_far
                path.write_text(json.dumps(out, indent=2) + "\n")

            out["envs"][task.env] = entry
            entry |= await measure_env(
                runtime, task, agent, rows, table, sides, levels, repeats, save, backends
            )
            for side in sides:
                print(f"{task.env} {side}: {json.dumps(entry[side])[:600]}", flush=True)
            if "opensandbox" in backends:
                entry["parity"] = parity(entry, sides)
                print(f"{task.env} parity: {json.dumps(entry['parity'])}", flush=True)
            out["envs"][task.env] = entry
            path.write_text(json.dumps(out, indent=2) + "\n")


def _rewards(side: dict[str, Any]) -> str:
    if "rewards" not in side:
        return "error"
    return ", ".join(f"{r:g}" for r in side["rewards"])


def _seconds(side: dict[str, Any]) -> str:
    return f"{side['s_per_rollout']:.1f}" if "s_per_rollout" in side else "error"


SIDE_ORDER = [side_name(side, provider) for provider in PROVIDERS for side in SIDES]
"""The sides in the tables' order: docker's native and ours, then OpenSandbox's."""


def sides_of(result: dict[str, Any]) -> list[str]:
    """The sides any environment of `result` has (ran or failed), in `SIDE_ORDER`; native and
    ours for a result of none."""
    present = {side for entry in result["envs"].values() for side in entry}
    return [side for side in SIDE_ORDER if side in present] or list(SIDES)


def table(result: dict[str, Any]) -> list[str]:
    """The markdown table docs/containers.md quotes: per environment, the per-row rewards (in row
    order: the right fix, then the useless edit) and the median seconds per rollout one at a
    time, of each side of the result (`sides_of`: native and ours for docker alone)."""
    sides = sides_of(result)
    head = [f"rewards {s}" for s in sides] + [f"s/rollout {s}" for s in sides]
    lines = [f"| environment | {' | '.join(head)} |", "|---" * (1 + len(head)) + "|"]
    for name, entry in result["envs"].items():
        got = [entry.get(s, {}) for s in sides]
        cells = [_rewards(side) for side in got] + [_seconds(side) for side in got]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return lines


def phase_table(result: dict[str, Any]) -> list[str]:
    """Per environment and side, the phases of a rollout run one at a time, in seconds (their
    means, `mean_phases`; each phase's median in a result without `phases_of`):
    the rollout's wall time, `/run`'s start, model, tools and finish (`verifiers_nemogym.
    phases`), and the rest of the wall time (`other`: verifiers' own work around `/run`)."""
    lines = [
        "| environment | side | s/rollout | start | model | tools | finish | other |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in result["envs"].items():
        for side in sides_of(result):
            p = entry.get(side, {}).get("phases")
            if not p:
                continue
            # + 0.0: a tiny negative `other` (clock rounding) shows as 0.0, not -0.0
            cells = [f"{round(p[k], 1) + 0.0:.1f}" for k in ("wall", *PHASES, "other")]
            lines.append(f"| {name} | {side} | {' | '.join(cells)} |")
    return lines


def ratio(native: dict[str, Any], ours: dict[str, Any]) -> float:
    """Rollouts per minute ours / native at one level: the median of the ratios taken within
    each round (both sides' batches of the same round met the same load), or of the totals for
    a result without rounds."""
    pairs = {b["repeat"]: b["per_minute"] for b in native.get("batches", [])}
    rounds = [
        b["per_minute"] / pairs[b["repeat"]]
        for b in ours.get("batches", [])
        if b["repeat"] in pairs
    ]
    if rounds:
        return statistics.median(rounds)
    return float(ours["per_minute"]) / float(native["per_minute"])


def _load_range(*levels: dict[str, Any]) -> str:
    """The 1-minute load average's range over the batches of `levels` (before and after each)."""
    seen = [
        b[k][0] for level in levels for b in level.get("batches", [level])
        for k in ("load_before", "load_after")
    ]  # fmt: skip
    return f"{min(seen):.1f}-{max(seen):.1f}"


def rate_table(result: dict[str, Any]) -> list[str]:
    """Per environment and level (`-c`), rollouts per minute native and ours, their ratio (the
    median of the rounds' ratios, `ratio`), the host's CPU busy share during each side's
    batches (all processes of the machine) and the 1-minute load average's range over them; a
    provider other than docker is named after the environment (`swebench_pro (opensandbox)`)."""
    lines = [
        "| environment | -c | per minute native | per minute ours | ours / native "
        "| CPU busy native | CPU busy ours | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (name, entry), provider in itertools.product(result["envs"].items(), PROVIDERS):
        native = entry.get(side_name("native", provider), {}).get("levels", {})
        ours = entry.get(side_name("ours", provider), {}).get("levels", {})
        label = name if provider == "docker" else f"{name} ({provider})"
        for level in result.get("levels", []):
            n, o = native.get(str(level)), ours.get(str(level))
            if n is None or o is None:
                continue
            lines.append(
                f"| {label} | {level} | {n['per_minute']:.1f} | {o['per_minute']:.1f} | "
                f"{ratio(n, o):.2f} | {n['cpu_busy']:.0%} | {o['cpu_busy']:.0%} | "
                f"{_load_range(n, o)} |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--env", action="append", default=[], help="an environment of the kit")
    parser.add_argument("--side", action="append", choices=sorted(SIDES), default=[])
    parser.add_argument(
        "--provider", action="append", choices=PROVIDERS, default=[],
        help="NeMo Gym sandbox provider of the sides' containers, repeatable (default docker; "
        "opensandbox starts the real opensandbox-server for the run)",
    )  # fmt: skip
    parser.add_argument(
        "--levels", default=",".join(map(str, LEVELS)),
        help="rollouts in flight per timed batch, comma-separated, the first 1 (default 1,2,4)",
    )  # fmt: skip
    parser.add_argument(
        "--repeats", type=int, default=REPEATS,
        help=f"interleaved rounds per level, each one batch per side (default {REPEATS})",
    )  # fmt: skip
    parser.add_argument("-o", "--output", type=Path, default=None)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, not {args.repeats}")
    try:
        levels = tuple(int(x) for x in args.levels.split(","))
    except ValueError:
        parser.error(f"--levels: not comma-separated integers: {args.levels!r}")
    if not levels or levels[0] != 1 or min(levels) < 1:
        parser.error("--levels must start with 1 (the phases are measured one at a time)")
    providers = [p for p in PROVIDERS if p in (args.provider or ["docker"])]
    sides = [side_name(s, p) for p in providers for s in args.side or ["native", "ours"]]
    day = datetime.date.today().isoformat()
    path = args.output or RESULTS / f"{day}-containers.json"
    result = asyncio.run(measure(args.env or None, sides, levels, args.repeats, path))
    print("\n".join([*table(result), "", *phase_table(result), "", *rate_table(result)]))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
