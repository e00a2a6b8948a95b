"""End to end on the real chain: vf-eval / Python API -> NeMoGymHarness -> NeMo Gym agent `/run`
-> model proxy -> verifiers interception -> scripted policy. Nothing is mocked but the model."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import model_context, read_episodes, run_tag, script

from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR, processes_with_env
from verifiers_nemogym.policies.scripted import ANSWER, ScriptedPolicy

pytestmark = pytest.mark.stack

ENV = "example_single_tool_call"


def check_calls(policy: ScriptedPolicy, traces: list[dict[str, Any]]) -> None:
    """Every rollout's two model calls reached the policy tagged with that rollout's session."""
    per_session = Counter(call.session_id for call in policy.calls)
    assert None not in per_session
    assert len(per_session) == len(traces)
    assert set(per_session.values()) == {2}
    for call in policy.calls:  # our routing keys never reach the model
        assert "vf_nemogym_route" not in json.dumps(call.body.get("metadata") or {})


async def test_vf_eval_runs_rollouts_on_a_real_stack(policy: ScriptedPolicy, tmp_path: Path):
    cmd = [
        script("vf-eval"), "nemo-gym-env", "-m", "scripted",
        "--client.base-url", policy.base_url, "--client.api-key-var", "SCRIPTED_KEY",
        "-n", "5", "-r", "3", "-c", "8", "--no-push", "-o", str(tmp_path / "out"),
        "--env.taskset.nemo-env", ENV,
    ]  # fmt: skip
    tag, env = run_tag()  # inherited by all the eval's descendants
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        env={**env, "SCRIPTED_KEY": "unused"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(proc.communicate(), timeout=900)
    log = output.decode(errors="replace")
    assert proc.returncode == 0, log[-5000:]
    eps = read_episodes(tmp_path / "out")
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
    assert processes_with_env(tag) == []


async def test_python_api_runs_episodes_and_stops_cleanly(policy: ScriptedPolicy):
    import nemo_gym_env

    env = nemo_gym_env.load_environment(nemo_env=ENV)
    tasks = list(env.taskset)
    ctx = model_context(policy)
    async with env.serving():
        marker = f"{MARKER_ENV_VAR}={env._stack.marker}"
        assert processes_with_env(marker) != []
        eps = await asyncio.gather(*(env.run_episode(t, ctx) for t in tasks))
    assert [e.ok for e in eps] == [True] * len(tasks)
    traces = [t for e in eps for t in e.traces]
    assert [t.reward for t in traces] == [1.0] * len(tasks)
    check_calls(policy, [t.model_dump() for t in traces])
    assert processes_with_env(marker) == []
