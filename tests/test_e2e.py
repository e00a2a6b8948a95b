"""End to end on the real chain: vf-eval / Python API -> NeMoGymHarness -> NeMo Gym agent `/run`
-> model proxy -> verifiers interception -> scripted policy. Nothing is mocked but the model."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import verifiers.v1 as vf
from conftest import wait_gone
from verifiers.v1.configs.client import EvalClientConfig

from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR, processes_with_env
from verifiers_nemogym.policies.scripted import ANSWER, ScriptedPolicy

ENV = "example_single_tool_call"


@pytest.fixture
async def policy():
    async with ScriptedPolicy() as p:
        yield p


def episodes(outdir: Path) -> list[dict[str, Any]]:
    (traces_file,) = outdir.glob("*/traces.jsonl")
    return [json.loads(line) for line in traces_file.read_text().splitlines() if line.strip()]


def check_calls(policy: ScriptedPolicy, traces: list[dict[str, Any]]) -> None:
    """Every rollout's two model calls reached the policy tagged with that rollout's session."""
    per_session = Counter(call.session_id for call in policy.calls)
    assert None not in per_session
    assert len(per_session) == len(traces)
    assert set(per_session.values()) == {2}
    for call in policy.calls:  # our routing keys never reach the model
        assert "vf_nemogym_route" not in json.dumps(call.body.get("metadata") or {})


async def test_vf_eval_runs_rollouts_on_a_real_stack(policy: ScriptedPolicy, tmp_path: Path):
    vf_eval = Path(sys.executable).with_name("vf-eval")
    cmd = [
        str(vf_eval), "nemo-gym-env", "-m", "scripted",
        "--client.base-url", policy.base_url, "--client.api-key-var", "SCRIPTED_KEY",
        "-n", "5", "-r", "3", "-c", "8", "--no-push", "-o", str(tmp_path / "out"),
        "--env.taskset.nemo-env", ENV,
    ]  # fmt: skip
    tag = f"VF_NEMOGYM_TEST_RUN={uuid.uuid4().hex}"  # inherited by all the eval's descendants
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        env={**os.environ, "SCRIPTED_KEY": "unused", tag.split("=")[0]: tag.split("=")[1]},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(proc.communicate(), timeout=900)
    log = output.decode(errors="replace")
    assert proc.returncode == 0, log[-5000:]
    eps = episodes(tmp_path / "out")
    traces = [t for e in eps for t in e["traces"]]
    assert len(eps) == 15 and len(traces) == 15
    assert all(e["ok"] for e in eps), [e["errors"] for e in eps if not e["ok"]][:2]
    for trace in traces:
        assert trace["rewards"]["nemo_gym"]["score"] == 1.0  # NeMo Gym's verify, not ours
        assert trace["info"]["nemo_gym"]["reward"] == 1.0
        assert "responses_create_params" not in trace["info"]["nemo_gym"]
        assert "vf_nemogym_secret" not in json.dumps(trace)
    # The trajectory is verifiers' own record: tool call, tool result, final answer.
    dumped = json.dumps(traces[0])
    assert "get_weather" in dumped and ANSWER in dumped
    check_calls(policy, traces)
    # Stack start-up progress lands in the run's eval.log (the package's one logging hand-off).
    (eval_log,) = (tmp_path / "out").glob("*/logs/latest/eval.log")
    assert "starting NeMo Gym stack" in eval_log.read_text()
    assert "NeMo Gym stack ready in" in eval_log.read_text()
    # The shared stack's host outlives vf-eval by its idle grace, then stops everything.
    assert await wait_gone(tag) == []


async def test_python_api_runs_episodes_and_stops_cleanly(policy: ScriptedPolicy):
    import nemo_gym_env

    env = nemo_gym_env.load_environment(nemo_env=ENV)
    tasks = list(env.taskset)
    client = EvalClientConfig(base_url=policy.base_url, api_key_var="SCRIPTED_KEY")
    ctx = vf.ModelContext(model="scripted", client=client)
    async with env.serving():
        marker = f"{MARKER_ENV_VAR}={env.stack_marker}"
        assert processes_with_env(marker) != []
        eps = await asyncio.gather(*(env.run_episode(t, ctx) for t in tasks))
    assert [e.ok for e in eps] == [True] * len(tasks)
    traces = [t for e in eps for t in e.traces]
    assert [t.reward for t in traces] == [1.0] * len(tasks)
    check_calls(policy, [t.model_dump() for t in traces])
    assert await wait_gone(marker) == []
