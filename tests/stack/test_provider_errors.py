"""verifiers' stops on a real NeMo Gym stack, through real `vf-eval`.

Only verifiers stopping a rollout (here its turn limit) may end `/run` early and keep NeMo Gym's
reward. The model is the only double: `ScriptedPolicy`. (A provider's error answer, which must
make its rollout an error naming the status, is tested on test_faults.py's shared stack.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.evals import vf_eval_command
from helpers.processes import gone, run_command, run_tag

from verifiers_nemogym.policies.scripted import ScriptedPolicy

ENV = "example_single_tool_call"


@pytest.mark.survey  # CI: the same stop through vf-eval's train client (test_train_mode.py)
async def test_turn_limit_stop_keeps_reward_through_vf_eval(policy: ScriptedPolicy, tmp_path: Path):
    """`--env.agent.max-turns 1`: verifiers refuses the second model call; the proxy turns that
    into an `incomplete` reply, NeMo Gym verifies, and the trace keeps its reward and stop."""
    tag, env = run_tag(SCRIPTED_KEY="unused")
    out = tmp_path / "out"
    cmd = vf_eval_command(
        "scripted", policy.base_url, "SCRIPTED_KEY", 3, 1, 3, out,
        "--env.taskset.nemo-env", ENV, "--env.agent.max-turns", "1",
        "--env.taskset.stack-idle-grace", "0",
    )  # fmt: skip
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
