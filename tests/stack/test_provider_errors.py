"""Provider errors and verifiers' stops on a real NeMo Gym stack, through real verifiers.

A provider's error answer (relayed by verifiers' interception with the provider's own status)
must make its rollout an error naming that status, never a reward; only verifiers stopping a
rollout (here its turn limit) may end `/run` early and keep NeMo Gym's reward. The model is the
only double: `ScriptedPolicy` and its `[fault:STATUS]` trigger.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import verifiers.v1 as vf
from helpers import error_text, gone, run_command, run_tag, run_timed, script, write_rows
from verifiers.v1.configs.client import EvalClientConfig

import nemo_gym_env
from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR
from verifiers_nemogym.policies.scripted import ScriptedPolicy

ENV = "example_single_tool_call"
AGENT = "example_single_tool_call_simple_agent"
STATUSES = [400, 401, 403, 404, 409, 422, 429, 500]
RUN_TIMEOUT = 20


async def test_every_provider_status_is_an_error_naming_it(
    policy: ScriptedPolicy, tmp_path: Path, secret_watch: Any, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.DEBUG)
    faults = {status: f"[fault:{status}] weather {status}?" for status in STATUSES}
    texts = [*faults.values(), "[fault:hang] weather?", "weather in Rome?", "weather in Oslo?"]
    env = nemo_gym_env.load_environment(
        jsonl_path=str(write_rows(tmp_path / "rows.jsonl", texts)),
        task={"run_timeout": RUN_TIMEOUT},
    )
    tasks = list(env.taskset)
    client = EvalClientConfig(base_url=policy.base_url, api_key_var="SCRIPTED_KEY")
    ctx = vf.ModelContext(model="scripted", client=client)
    async with env.serving():
        secret_watch.watch(env)
        marker = f"{MARKER_ENV_VAR}={env.stack_marker}"
        live = env.taskset.config.task._live
        episodes, durations = await run_timed(env, tasks, ctx)
        assert live.proxy.open_routes == 0
    assert len(episodes) == len(texts)  # none lost
    by_text = {e.task.data.prompt_text: e for e in episodes}
    for text in texts[-2:]:
        assert by_text[text].ok and by_text[text].traces[0].reward == 1.0, error_text(by_text[text])
    for status, text in faults.items():
        episode = by_text[text]
        trace = episode.traces[0]
        assert not episode.ok and not trace.ok, f"{status} must be an error"
        assert trace.rewards.get("nemo_gym") is None  # an error, not a reward
        # verifiers re-raises the provider's error it stashed for the call as the rollout's
        # real cause (our harness's AgentRunError, naming the same status, is its __cause__).
        assert [(e.type, e.status_code) for e in trace.errors] == [("ProviderError", status)]
        assert f"scripted fault {status}" in trace.errors[0].message, trace.errors[0].message
        print(f"PROVIDER-STATUS {status} ({durations[text]:.2f} s): {trace.errors[0].type}: ")
        print(f"    {trace.errors[0].message}")
        # Ended by the provider's answer, not by the rollout's deadline.
        assert durations[text] < RUN_TIMEOUT / 2, durations[text]
        # The per-call record verifiers keeps on the trace agrees.
        assert any(c.error is not None and c.error.status_code == status for c in trace.calls)
    hung = by_text["[fault:hang] weather?"]
    assert not hung.ok and f"did not return within {RUN_TIMEOUT} s" in error_text(hung)
    print(f"PROVIDER-STATUS hang: {hung.traces[0].errors[0].type}: {error_text(hung)}")
    texts_seen = {f"trace {e.traces[0].id}": json.dumps(e.traces[0].to_record()) for e in episodes}
    texts_seen |= {f"errors of {e.task.data.prompt_text}": error_text(e) for e in episodes}
    texts_seen["log"] = caplog.text
    secret_watch.assert_absent(texts_seen)
    assert len(secret_watch.secrets) == 1 + len(texts)  # the proxy's and one per rollout
    assert await gone(marker) == []


async def test_turn_limit_stop_keeps_reward_through_vf_eval(policy: ScriptedPolicy, tmp_path: Path):
    """`--env.agent.max-turns 1`: verifiers refuses the second model call; the proxy turns that
    into an `incomplete` reply, NeMo Gym verifies, and the trace keeps its reward and stop."""
    tag, env = run_tag(SCRIPTED_KEY="unused")
    out = tmp_path / "out"
    cmd = [
        script("vf-eval"), "nemo-gym-env", "-m", "scripted",
        "--client.base-url", policy.base_url, "--client.api-key-var", "SCRIPTED_KEY",
        "-n", "3", "-r", "1", "-c", "3", "--no-push", "-o", str(out),
        "--env.taskset.nemo-env", ENV, "--env.agent.max-turns", "1",
    ]  # fmt: skip
    code, log = await run_command(cmd, env, timeout=600)
    assert code == 0, log[-3000:]
    assert await gone(tag) == []
    traces_files = list(out.rglob("traces.jsonl"))
    assert len(traces_files) == 1, traces_files
    episodes = [json.loads(line) for line in traces_files[0].read_text().splitlines()]
    assert [e["ok"] for e in episodes] == [True] * 3
    traces = [t for e in episodes for t in e["traces"]]
    assert len(traces) == 3
    for trace in traces:
        assert trace["ok"] is True and trace["errors"] == [], trace["errors"]
        assert trace["stop_condition"] == "max_turns", trace["stop_condition"]
        # NeMo Gym verified the stopped rollout, and its reward is the trace's.
        assert trace["rewards"]["nemo_gym"]["score"] == trace["info"]["nemo_gym"]["reward"]
    # The refused second call never reached the model: one call per rollout.
    assert len(policy.calls) == 3 and len({c.session_id for c in policy.calls}) == 3
    # No routing secret in anything the run wrote (traces, configs, logs) or printed.
    written = [p.read_text(errors="replace") for p in out.rglob("*") if p.is_file()]
    assert all("vf_nemogym_secret" not in text for text in [*written, log])
