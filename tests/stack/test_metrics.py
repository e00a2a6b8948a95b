"""NeMo Gym's aggregate metrics through this package equal NeMo Gym's own eval's, key for key.

Native: NeMo Gym's own collection (`ng_collect_rollouts`; `gym eval run --no-serve` on 0.7) of the
first ROWS rows x REPEATS, policy = the scripted policy registered directly as `policy_model`,
writing `<output>_aggregate_metrics.json`. Ours: `vf-eval -n ROWS -r REPEATS` with the same
deterministic policy through the proxy, which writes `nemo_gym_aggregate_metrics.json` beside
its traces. Every agent entry's `agent_metrics`, `key_metrics`, `group_level_metrics` (and 0.7's
`repeat_level_metrics`) must be equal, floats to 1e-9. Once (0.4.0 mcqa), `nemo-gym-env metrics`
on a prime-rl-shaped stream folder of the same traces (a sealed `.jsonl.zst` chunk and a plain
`.jsonl` one) must print the same file, and on vf-eval's `-o` folder the same key metrics."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest
import zstandard
from helpers.evals import script, vf_eval_command
from helpers.processes import gone, run_command, run_tag
from helpers.stacks import runtime_flags

from benchmarks.native import collect_rollouts, native_stack
from verifiers_nemogym.metrics import METRICS_FILE
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.venv import NeMoGymVenv, ensure_venv
from verifiers_nemogym.policies.scripted import ScriptedPolicy

ROWS, REPEATS = 3, 4
# Environments with their own compute_metrics / get_key_metrics.
CASES = [("0.4.0", "mcqa"), ("0.4.0", "hotpotqa_qa"), ("0.7.0", "mcqa")]
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


@pytest.mark.parametrize(("version", "env"), CASES, ids=[f"{v}-{e}" for v, e in CASES])
async def test_aggregate_metrics_equal_nemo_gyms_own_eval(
    version: str, env: str, policy: ScriptedPolicy, tmp_path: Path
) -> None:
    runtime = _runtime(version)
    out = tmp_path / "out"
    cmd = vf_eval_command(
        "scripted", policy.base_url, "SCRIPTED_KEY", ROWS, REPEATS, 4, out,
        "--env.taskset.nemo-env", env, *runtime_flags(runtime),  # the default: a shared stack
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
    assert [e["agent_ref"]["name"] for e in ours] == [e["agent_ref"]["name"] for e in native]
    for mine, theirs in zip(ours, native, strict=True):
        assert mine["agent_metrics"]["mean/reward"] is not None
        for part in COMPARED:
            if part in theirs:
                _same(mine[part], theirs[part], f"{env}@{version}:{part}")
    # The key metrics are logged at the end of the run (its eval.log).
    logged = (run.parent / "logs" / "latest" / "eval.log").read_text()
    assert f"NeMo Gym aggregate metrics ({written}):" in logged, logged[-3000:]
    for key in ours[0]["key_metrics"]:
        assert key in logged
    assert await gone(tag) == []
    if (version, env) != CASES[0]:
        return
    # prime-rl's trace folder: a sealed (zstd) chunk, then the chunk still being written.
    stream = tmp_path / "prime" / "monitors/file/traces/stream"
    stream.mkdir(parents=True)
    lines = run.read_bytes().splitlines(keepends=True)
    half = len(lines) // 2
    (stream / "000000.jsonl.zst").write_bytes(zstandard.compress(b"".join(lines[:half])))
    (stream / "000001.jsonl").write_bytes(b"".join(lines[half:]))
    # ...and vf-eval's `-o` folder itself (it holds one run); its log says what it starts and
    # why, and nothing of verifiers' rollout machinery (no interception). One after the other:
    # two started at the same moment on CI's cold cache once lost a head server.
    tag, environ = run_tag()
    code, printed = await run_command(
        [script("nemo-gym-env"), "metrics", str(stream), "--json"], environ, stdout_only=True
    )
    o_code, o_log = await run_command([script("nemo-gym-env"), "metrics", str(out)], environ)
    assert code == 0, printed[-3000:]
    assert printed == written.read_text()
    assert o_code == 0, o_log[-3000:]
    assert f"{out} holds one run: {run.parent}" in o_log
    # simple_agent forwards its aggregate to its resources server: a stack answers it.
    assert "mcqa_simple_agent needs a stack for its aggregate: SimpleAgent overrides " in o_log
    assert "starting a private NeMo Gym 0.4.0 stack with the configs of mcqa_simple_agent" in o_log
    assert "interception" not in o_log
    for key in ours[0]["key_metrics"]:
        assert f"{key} " in o_log, o_log[-3000:]
    assert await gone(tag) == []
