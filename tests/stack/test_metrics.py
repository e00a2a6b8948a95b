"""NeMo Gym's aggregate metrics through this package equal NeMo Gym's own eval's, key for key.

Native: NeMo Gym's own collection (`ng_collect_rollouts`; `gym eval run --no-serve` on 0.7) of the
first ROWS rows x REPEATS of the case's environment, policy = the scripted policy registered
directly as `policy_model`, writing `<output>_aggregate_metrics.json`. Ours: `vf-eval -n ROWS -r
REPEATS` with the same deterministic policy through the proxy, which writes
`nemo_gym_aggregate_metrics.json` beside its traces. Every agent entry's `agent_metrics`,
`key_metrics`, `group_level_metrics` (and 0.7's `repeat_level_metrics`) must be equal, floats to
1e-9. Once (0.7.0 mcqa), `nemo-gym-env metrics --json` on vf-eval's `-o` folder must print the
same file, computed on a private stack of the run's agents."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest
from helpers.evals import script, vf_eval_command
from helpers.processes import gone, run_command, run_tag
from helpers.stacks import runtime_flags

from benchmarks.native import collect_rollouts, native_stack
from verifiers_nemogym.metrics import METRICS_FILE
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.venv import NeMoGymVenv, ensure_venv
from verifiers_nemogym.policies.scripted import ScriptedPolicy

ROWS, REPEATS = 3, 4
# Environments with their own compute_metrics / get_key_metrics, one a case: the aggregate's
# task indices count a run's rows (ours: environment, then line), so environments mixed in one
# run compare only with one native collection of the same mixed rows.
CASES = [("0.4.0", "mcqa"), ("0.4.0", "hotpotqa_qa"), ("0.7.0", "mcqa")]
SURVEYED = {CASES[0], CASES[1]}  # CI: mcqa on 0.7.0, whose agents' metrics differ most
CLI_CASE = CASES[2]
"""The case that also checks `nemo-gym-env metrics --json`."""
COMPARED = ("agent_metrics", "key_metrics", "group_level_metrics", "repeat_level_metrics")


def _runtime(version: str) -> NeMoGymVenv:
    return ensure_venv(version, allow_below_floor=version != "0.4.0")


def _same(ours: Any, native: Any, where: str) -> None:
    """Equal, floats to 1e-9 (NaN equal to NaN), naming the first key that differs."""
    if isinstance(native, dict):
        assert isinstance(ours, dict), where
        assert sorted(ours) == sorted(native), f"{where}: keys {sorted(ours)} != {sorted(native)}"
        for key in native:
            _same(ours[key], native[key], f"{where}/{key}")
    elif isinstance(native, list):
        assert isinstance(ours, list) and len(ours) == len(native), where
        for i, (a, b) in enumerate(zip(ours, native, strict=True)):
            _same(a, b, f"{where}[{i}]")
    elif isinstance(native, float) and isinstance(ours, int | float):
        both_nan = math.isnan(native) and math.isnan(ours)
        assert both_nan or math.isclose(ours, native, rel_tol=1e-9, abs_tol=1e-9), (
            f"{where}: {ours} != {native}"
        )
    else:
        assert ours == native, f"{where}: {ours!r} != {native!r}"


async def _native(runtime: NeMoGymVenv, env: str, policy: ScriptedPolicy, tmp: Path) -> Any:
    spec = Catalog(runtime).env(env)
    lines = [line for line in spec.dataset("example").read_text().splitlines() if line.strip()]
    rows = tmp / "rows.jsonl"
    rows.write_text("\n".join(lines[:ROWS]) + "\n")
    stack = native_stack(runtime, spec.config_paths, policy.port)
    try:
        await stack.start()
        output = tmp / "native.jsonl"
        await collect_rollouts(
            runtime, stack, spec.agent.name, rows, output, repeats=REPEATS, in_flight=4
        )
    finally:
        await stack.stop()
    return json.loads((tmp / "native_aggregate_metrics.json").read_text())


@pytest.mark.parametrize(
    ("version", "env"),
    [pytest.param(*c, marks=[pytest.mark.survey] if c in SURVEYED else []) for c in CASES],
    ids=[f"{v}-{e}" for v, e in CASES],
)
async def test_aggregate_metrics_equal_nemo_gyms_own_eval(
    version: str, env: str, policy: ScriptedPolicy, tmp_path: Path
) -> None:
    runtime = _runtime(version)
    out = tmp_path / "out"
    cmd = vf_eval_command(
        "scripted", policy.base_url, "SCRIPTED_KEY", ROWS, REPEATS, 4, out,
        "--env.taskset.nemo-env", env,
        *runtime_flags(runtime),  # the default: a shared stack
        "--env.taskset.stack-idle-grace", "0",
    )  # fmt: skip
    tag, environ = run_tag(SCRIPTED_KEY="unused")
    # Both sides at once (their own stacks; the policy answers each call the same): the test
    # takes the time of the slower one.
    native, (code, log) = await asyncio.gather(
        _native(runtime, env, policy, tmp_path), run_command(cmd, environ)
    )
    assert code == 0, log[-5000:]
    (run,) = out.glob("*/traces.jsonl")
    written = run.parent / METRICS_FILE
    ours = json.loads(written.read_text())
    names = [e["agent_ref"]["name"] for e in native]
    assert [e["agent_ref"]["name"] for e in ours] == names
    for mine, theirs in zip(ours, native, strict=True):
        assert mine["agent_metrics"]["mean/reward"] is not None
        for part in COMPARED:
            if part in theirs:
                _same(mine[part], theirs[part], f"{env}@{version}:{part}")
    # The key metrics are logged at the end of the run (its eval.log).
    logged = (run.parent / "logs" / "latest" / "eval.log").read_text()
    assert f"NeMo Gym aggregate metrics ({written}):" in logged, logged[-3000:]
    for entry in ours:
        for key in entry["key_metrics"]:
            assert key in logged
    assert await gone(tag) == []
    if (version, env) != CLI_CASE:
        return
    # `nemo-gym-env metrics` on vf-eval's `-o` folder (it holds one run) prints the same file;
    # its log says what it starts and why, and nothing of verifiers' rollout machinery (no
    # interception). (A prime-rl stream folder reads as the same rollouts: tests/test_metrics.py.)
    tag, environ = run_tag()
    proc = await asyncio.create_subprocess_exec(
        script("nemo-gym-env"), "metrics", str(out), "--json", env=environ,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    printed, logged_bytes = await asyncio.wait_for(proc.communicate(), 900)
    o_log = logged_bytes.decode(errors="replace")
    assert proc.returncode == 0, o_log[-3000:]
    assert printed.decode() == written.read_text()
    assert f"{out} holds one run: {run.parent}" in o_log
    # simple_agent forwards its aggregate to its resources server: a stack answers it.
    starting = f"starting a private NeMo Gym {version} stack with the configs of "
    assert o_log.count(starting) == 1, o_log[-3000:]  # one stack for every agent of the run
    for agent in names:
        assert f"{agent} needs a stack for its aggregate: SimpleAgent overrides " in o_log
        assert agent in o_log.split(starting, 1)[1].split("\n", 1)[0]
    assert "interception" not in o_log
    assert await gone(tag) == []
