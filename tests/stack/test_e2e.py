"""End to end on the real chain: vf-eval / Python API -> NeMoGymHarness -> NeMo Gym agent `/run`
-> model proxy -> verifiers interception -> scripted policy. Nothing is mocked but the model."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

from helpers.evals import model_context, read_episodes, vf_eval_command
from helpers.processes import gone, run_command, run_tag
from helpers.stacks import SURVEYED_ON_040, runtime_flags

from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR, processes_with_env
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.policies.scripted import ANSWER, ScriptedPolicy
from verifiers_nemogym.stack_access import PrivateStack, SharedStack

ENV = "example_single_tool_call"


def check_calls(policy: ScriptedPolicy, traces: list[dict[str, Any]]) -> None:
    """Every rollout's two model calls reached the policy tagged with that rollout's session."""
    per_session = Counter(call.session_id for call in policy.calls)
    assert None not in per_session
    assert len(per_session) == len(traces)
    assert set(per_session.values()) == {2}
    for call in policy.calls:  # our routing keys never reach the model
        assert "vf_nemogym_route" not in json.dumps(call.body.get("metadata") or {})


# 0.4.0 (the default) in CI: vf-eval in test_shared_stack.py, the Python API in test_judges.py
@SURVEYED_ON_040
async def test_vf_eval_runs_rollouts_on_a_real_stack(
    policy: ScriptedPolicy, tmp_path: Path, any_nemo_venv: NeMoGymVenv
):
    flags = runtime_flags(any_nemo_venv)
    cmd = vf_eval_command("scripted", policy.base_url, "SCRIPTED_KEY", 5, 3, 8, tmp_path / "out",
                          "--env.taskset.nemo-env", ENV, *flags)  # fmt: skip
    tag, env = run_tag(SCRIPTED_KEY="unused")  # inherited by all the eval's descendants
    code, log = await run_command(cmd, env)
    assert code == 0, log[-5000:]
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
    assert "NeMo Gym stack ready" in eval_log.read_text()
    assert f"nemo-gym-{any_nemo_venv.nemo_gym_version}" in eval_log.read_text()
    # A shared stack's host outlives vf-eval by its idle grace, then stops everything.
    assert await gone(tag) == []


def _load_env(runtime: NeMoGymVenv, **options: Any) -> Any:
    """nemo-gym-env on `runtime`'s release and Python (with the floor opt-in it was built with)."""
    import nemo_gym_env

    env = nemo_gym_env.load_environment(
        nemo_env=ENV,
        # A private stack: the test inspects where each agent's `/run` went.
        shared_stack=False,
        nemo_gym_version=runtime.nemo_gym_version,
        python=str(runtime.python),
        allow_python_below_floor=runtime.below_floor,
        **options,
    )
    assert env.taskset.nemo_venv == runtime
    return env


async def _run_all(env: Any, policy: ScriptedPolicy) -> tuple[list[Any], int, dict[str, str]]:
    """Every task once inside `env.serving()`: the episodes (all ok, no process left), how
    many model calls reached the proxy as `/ng-rollout/<id>/v1/...`, and where each agent's
    `/run` went (`NeMoGymStack.run_urls`, for agents whose URL differs)."""
    tasks = list(env.taskset)
    ctx = model_context(policy)
    async with env.serving():
        marker = f"{MARKER_ENV_VAR}={env.stack_marker}"
        assert processes_with_env(marker) != []
        eps = await asyncio.gather(*(env.run_episode(t, ctx) for t in tasks))
        prefixed = env._proxy.rollout_path_calls
        assert isinstance(env.stack, PrivateStack)
        stack = env.stack.process
        relayed = {a: u for a, u in stack.run_urls.items() if u != stack.agents[a]}
        assert set(stack.servers.values()) >= set(stack.run_urls.values())
    assert [e.ok for e in eps] == [True] * len(tasks), [e.errors for e in eps if not e.ok][:2]
    assert processes_with_env(marker) == []
    return eps, prefixed, relayed


@SURVEYED_ON_040
async def test_python_api_runs_episodes_and_stops_cleanly(
    policy: ScriptedPolicy, any_nemo_venv: NeMoGymVenv, tmp_path: Path
):
    """The Python API on a private stack: every episode scores NeMo Gym's reward, each agent's
    `/run` goes where the release sends it, and nothing is left. On 0.7.0 with NeMo Gym's
    observability on (one stack start for both): its agents call `/ng-rollout/<id>/v1/...`, the
    id being our route id (the row's `_ng_rollout_id`), so every call still reaches its rollout."""
    observed = any_nemo_venv.nemo_gym_version == "0.7.0"
    extra = tmp_path / "observability.yaml"
    if observed:
        extra.write_text("observability_enabled: true\n")
    env = _load_env(any_nemo_venv, config_paths=[str(extra)] if observed else [])
    eps, prefixed, relayed = await _run_all(env, policy)
    traces = [t for e in eps for t in e.traces]
    assert [t.reward for t in traces] == [1.0] * len(eps)
    check_calls(policy, [t.model_dump() for t in traces])
    if not observed:
        assert prefixed == 0 and relayed == {}  # NeMo Gym 0.4.0 has no observability
        return
    assert prefixed == len(policy.calls) == 2 * len(eps)
    # NeMo Gym 0.7's own path: /run goes to the environment server fronting the agent.
    assert list(relayed) == [f"{ENV}_simple_agent"]
    info = traces[0].info["nemo_gym"]
    assert info["mask_sample"] is False
    assert "mask_sample" not in traces[0].metrics  # a boolean is not a metric
    # NeMo Gym's trajectory echo stays out of the trace unless asked for.
    assert "ng_trajectory" not in info


async def test_observability_on_a_shared_stack_routes_through_the_front(
    policy: ScriptedPolicy, nemo_venv_07: NeMoGymVenv, tmp_path: Path
):
    """The default path (a shared stack): NeMo Gym's policy model is the front forwarder, which
    must pass `/ng-rollout/<id>/v1/...` calls on to this process's proxy."""
    import nemo_gym_env

    extra = tmp_path / "observability.yaml"
    extra.write_text("observability_enabled: true\n")
    env = nemo_gym_env.load_environment(
        nemo_env=ENV,
        config_paths=[str(extra)],
        stack_idle_grace=0,  # its only user: it stops as it leaves
        nemo_gym_version=nemo_venv_07.nemo_gym_version,
        python=str(nemo_venv_07.python),
        allow_python_below_floor=nemo_venv_07.below_floor,
    )
    tasks = list(env.taskset)
    async with env.serving():
        assert isinstance(env.stack, SharedStack)  # attached to (here: started) the shared stack
        marker = f"{MARKER_ENV_VAR}={env.stack_marker}"
        eps = await asyncio.gather(*(env.run_episode(t, model_context(policy)) for t in tasks))
        prefixed = env._proxy.rollout_path_calls
    assert [e.ok for e in eps] == [True] * len(tasks), [e.errors for e in eps if not e.ok][:2]
    traces = [t for e in eps for t in e.traces]
    assert [t.reward for t in traces] == [1.0] * len(eps)
    check_calls(policy, [t.model_dump() for t in traces])
    assert prefixed == len(policy.calls) == 2 * len(eps)
    assert await gone(marker) == []  # the last user left: the stack stops
