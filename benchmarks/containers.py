"""NeMo Gym's container environments, natively and through nemo-gym-env, in one run:
`uv run python -m benchmarks.containers [--env ENV ...] [--side native|ours ...] [--repeats N]`

Each container environment of the hand-made task kit (`containers.tasks.make_tasks`: swebench_pro
`tinycalc`, terminal_bench_2_1 `wordstats`, and any other environment the kit provides) runs
OpenCode inside the task's docker container, against the fixer policy (`policies.fixer`). Its
row is duplicated per case, the problem tagged with the case (so the fixer tells the rows
apart), and each case has its own fixer entry: case 0 gets the right fix (NeMo Gym's reward
1.0), case 1 a real but useless edit (0.0). Both sides get the same rows, images, NeMo Gym
configs and fixer table; rollouts run one at a time.

- `native`: plain NeMo Gym 0.7 as a user runs it. `gym env start` with NeMo Gym's pairing
  (`benchmarks/<...>/opencode.yaml`), the docker provider config, the kit's override, and a
  native override (`sandbox.docker.create.network: host`, so the container reaches the
  127.0.0.1 model server; the agent's `artifacts_dir` in the run's folder); `policy_model` is
  NeMo Gym's own `openai_model` on the env.yaml keys, pointing at the fixer. Rewards come from
  `gym eval run --no-serve` (one rollout in flight); seconds per rollout from the same rows
  posted to the environment's `/run` one at a time afterwards (`--repeats` passes). The stack
  is stopped by our supervisor (Ray's token in a private file). Every container NeMo Gym's
  docker provider creates also gets a label of this run (its `extra_run_args`), so the ones
  left afterwards, and only those, are counted in the result, then removed (others may be
  running NeMo Gym on the same daemon).
- `ours`: `vf-eval nemo-gym-env` with `--env.taskset.config-paths <pairing> <docker.yaml>
  <override>`, `--env.taskset.jsonl-path <rows>`, `--env.taskset.agent <agent>`, the fixer as
  the model, `-c 1 -r <repeats>`: rewards and seconds per rollout (a trace's boot start to its
  scoring end) from the traces vf-eval wrote; the containers of its stack left afterwards (the
  stack's label, found by the network its host log names) are counted.

Writes `benchmarks/results/<date>-containers.json` (or `-o`); `table()` renders the docs table
from it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from benchmarks.harnesses import (
    NativeHarnessStack,
    report_head,
    run_native_stack,
)
from verifiers_nemogym.containers import docker
from verifiers_nemogym.containers.sandbox import PROVIDER_CONFIG, STACK_LABEL
from verifiers_nemogym.containers.tasks import KitTask, TaskKit, make_tasks
from verifiers_nemogym.nemo.venv import NeMoGymVenv, ensure_venv
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


async def run_native(
    runtime: NeMoGymVenv, task: KitTask, agent: str, rows: Path, table: list[FixTask],
    repeats: int,
) -> dict[str, Any]:  # fmt: skip
    """`task`'s environment on plain NeMo Gym (module contract)."""
    site = runtime.site_packages
    openai_model = site / "responses_api_models/openai_model/configs/openai_model.yaml"
    run_label = f"{RUN_LABEL}={uuid.uuid4().hex}"
    load_before = load()
    try:
        async with FixerPolicy(tasks=table, wrong=wrong_cases()) as policy:
            with tempfile.TemporaryDirectory(prefix="containers-native-") as tmp:
                native = Path(tmp, "native.yaml")
                impl = {"opencode_sandboxed_agent": {"artifacts_dir": str(Path(tmp, "artifacts"))}}
                native.write_text(
                    yaml.safe_dump(
                        {
                            "sandbox": {
                                "docker": {
                                    "create": {
                                        "network": "host",
                                        "extra_run_args": ["--label", run_label],
                                    }
                                }
                            },
                            agent: {"responses_api_agents": impl},
                        }
                    )
                )
                configs = [site / p for p in task.config_paths]
                configs += [site / DOCKER_CONFIG, task.override, native, openai_model]
                run = await run_native_stack(
                    NativeContainerStack, runtime, configs, [], policy, POLICY_KEY, agent, rows,
                    tmp, in_flight=1, repeats=repeats,
                )  # fmt: skip
            log = policy.log
    finally:
        left = containers(run_label)
        if left:
            docker.run_docker("rm", "-f", *sorted(left))
    return {
        "rewards": run.rewards,
        "timed_rewards": run.timed,
        "s_per_rollout": round(statistics.median(run.rollout_s), 2),
        "rollout_s": [round(s, 2) for s in run.rollout_s],
        "start_s": round(run.start_s, 1),
        "collect_s": round(run.collect_s, 1),
        "policy_calls": {"collect": run.collected, "total": len(log)},
        "calls_by_case": _calls_by_case(log, len(table)),
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


def _stack_containers_left(out: Path) -> int | None:
    """Containers of the stack a vf-eval run (`out`) used that are still there: the stack host's
    log (named in eval.log) names the stack's docker network, `vfng-<marker prefix>`, and each
    container carries `<STACK_LABEL>=<marker>`. None (unknown) if the logs name no network."""
    eval_log = next(out.glob("*/logs/latest/eval.log")).read_text()
    host_log = re.search(r"log: (\S+host\.log)", eval_log)
    if host_log is None:
        return None
    network = re.search(r"docker network (vfng-\w+)", Path(host_log.group(1)).read_text())
    if network is None:
        return None
    prefix = network.group(1).removeprefix("vfng-")
    template = '{{.Label "%s"}}' % STACK_LABEL  # noqa: UP031 (a Go template's braces)
    labels = docker.run_docker(
        "ps", "-a", "--filter", f"label={STACK_LABEL}", "--format", template
    ).split()
    return sum(1 for marker in labels if marker.startswith(prefix))


def _case_of(trace: dict[str, Any], table: list[FixTask]) -> int:
    """The case a trace's task quotes (the longest key found)."""
    text = json.dumps(trace["task"])
    found = [i for i, t in enumerate(table) if json.dumps(t.key)[1:-1] in text]
    if not found:
        raise RuntimeError("a trace quotes no case")
    return max(found, key=lambda i: len(table[i].key))


def _trace_seconds(trace: dict[str, Any]) -> float:
    """Seconds from the rollout's boot to the end of its last phase (scoring)."""
    timing = trace["timing"]
    phases = ("boot", "setup", "agent", "finalize", "scoring")
    return max(float(timing[p]["end"]) for p in phases) - float(timing["boot"]["start"])


async def run_ours(
    runtime: NeMoGymVenv, task: KitTask, agent: str, rows: Path, table: list[FixTask],
    repeats: int,
) -> dict[str, Any]:  # fmt: skip
    """`task`'s environment through vf-eval nemo-gym-env (module contract)."""
    configs = [*task.config_paths, DOCKER_CONFIG, str(task.override)]
    load_before = load()
    async with FixerPolicy(tasks=table, wrong=wrong_cases()) as policy:
        with tempfile.TemporaryDirectory(prefix="containers-ours-") as tmp:
            out = Path(tmp, "out")
            command = [
                str(Path(sys.executable).with_name("vf-eval")), "nemo-gym-env", "-m", MODEL,
                "--client.base-url", policy.base_url, "--client.api-key-var", "FIXER_KEY",
                "-n", str(len(table)), "-r", str(repeats), "-c", "1", "--no-push",
                "-o", str(out),
                "--env.taskset.config-paths", json.dumps(configs),
                "--env.taskset.jsonl-path", str(rows),
                "--env.taskset.agent", agent,
                "--env.taskset.stack-idle-grace", "0",
                "--env.taskset.nemo-gym-version", runtime.nemo_gym_version,
                "--env.taskset.python", str(runtime.python),
                "--env.taskset.allow-python-below-floor", str(runtime.below_floor).lower(),
            ]  # fmt: skip
            began = time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                *command,
                env={**os.environ, "FIXER_KEY": "unused"},
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            try:
                output, _ = await asyncio.wait_for(proc.communicate(), 3600)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            eval_s = time.monotonic() - began
            if proc.returncode != 0:
                text = output.decode(errors="replace")
                raise RuntimeError(f"vf-eval exit {proc.returncode}:\n{text[-3000:]}")
            left = _stack_containers_left(out)
            (traces_file,) = out.glob("*/traces.jsonl")
            episodes = [json.loads(line) for line in traces_file.read_text().splitlines() if line]
        log = policy.log
    traces = [t for e in episodes for t in e["traces"]]
    errors = [t["errors"] for t in traces if t.get("errors")]
    if errors:
        raise RuntimeError(f"{len(errors)} rollouts failed: {json.dumps(errors[0])[:1000]}")
    per_case: list[list[float]] = [[] for _ in table]
    seconds = []
    for trace in sorted(traces, key=lambda t: float(t["timing"]["boot"]["start"])):
        per_case[_case_of(trace, table)].append(float(trace["rewards"]["nemo_gym"]["score"]))
        seconds.append(_trace_seconds(trace))
    if any(len(r) != repeats for r in per_case):
        raise RuntimeError(f"rollouts per case {[len(r) for r in per_case]}, wanted {repeats}")
    return {
        "rewards": [r[0] for r in per_case],
        "timed_rewards": [[r[k] for r in per_case] for k in range(repeats)],
        "s_per_rollout": round(statistics.median(seconds), 2),
        "rollout_s": [round(s, 2) for s in seconds],
        "eval_s": round(eval_s, 1),
        "policy_calls": {"total": len(log)},
        "calls_by_case": _calls_by_case(log, len(table)),
        "containers_left": left,
        "load_before": load_before,
        "load_after": load(),
    }


SIDES = {"native": run_native, "ours": run_ours}


async def measure(envs: list[str] | None, sides: list[str], repeats: int) -> dict[str, Any]:
    runtime = ensure_venv(NEMO_GYM_VERSION, allow_below_floor=True)
    kit: TaskKit = await asyncio.to_thread(make_tasks, cache_root() / "bench-containers-kit")
    chosen = [t for t in kit.tasks if envs is None or t.env in envs]
    out: dict[str, Any] = {
        **report_head(runtime),
        "cases": ["right" if right else "wrong" for right in CASES],
        "expected_rewards": expected_rewards(),
        "repeats": repeats,
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
                    entry[side] = await SIDES[side](runtime, task, agent, rows, table, repeats)
                except Exception as e:  # one side failing is a result, not the end
                    entry[side] = {"error": f"{type(e).__name__}: {str(e)[-3000:]}"}
                print(f"{task.env} {side}: {json.dumps(entry[side])[:600]}", flush=True)
            out["envs"][task.env] = entry
    return out


def _rewards(side: dict[str, Any]) -> str:
    if "rewards" not in side:
        return "error"
    return ", ".join(f"{r:g}" for r in side["rewards"])


def _seconds(side: dict[str, Any]) -> str:
    return f"{side['s_per_rollout']:.1f}" if "s_per_rollout" in side else "error"


def table(result: dict[str, Any]) -> list[str]:
    """The markdown table docs/harnesses.md quotes: per environment, the per-row rewards (in row
    order: the right fix, then the useless edit) and the median seconds per rollout, native and
    ours."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--env", action="append", default=[], help="an environment of the kit")
    parser.add_argument("--side", action="append", choices=sorted(SIDES), default=[])
    parser.add_argument("--repeats", type=int, default=1, help="timed passes over the rows")
    parser.add_argument("-o", "--output", type=Path, default=None)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    sides = args.side or ["native", "ours"]
    result = asyncio.run(measure(args.env or None, sides, args.repeats))
    day = datetime.date.today().isoformat()
    path = args.output or RESULTS / f"{day}-containers.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(table(result)))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
