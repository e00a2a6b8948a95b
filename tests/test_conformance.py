"""Conformance (`nemo-gym-env conformance`) short of running a stack: the command's checks,
the rows made from NeMo Gym's recordings and the gaps in them, the report's lines for start
errors, known reasons and secrets, and how environments are split over successive stacks.
The reward parity on a real stack is tests/stack/test_conformance.py."""

from __future__ import annotations

import json
import socket

import pytest
from verifiers.v1.trace import AgentInfo, Trace, TraceTask

import nemo_gym_env
from verifiers_nemogym.bridge import redact
from verifiers_nemogym.cli import main as cli_main
from verifiers_nemogym.conformance import run as conformance_run
from verifiers_nemogym.conformance.compare import (
    compare_answers,
    explain,
    metrics_reason,
    model_figure,
    numbering,
    recorded_results,
    replayed_results,
)
from verifiers_nemogym.conformance.report import (
    EnvReport,
    MetricsComparison,
    RowResult,
    error_line,
    format_report,
    start_error_line,
)
from verifiers_nemogym.conformance.rows import LACKS_FIELDS, example_rows, replay_row
from verifiers_nemogym.conformance.run import STACK_ENVS, run_conformance
from verifiers_nemogym.conformance.tables import CI_ENVS, KNOWN_REASONS, RESCORED
from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.harness import record
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.policies.replay import load_recordings


def test_conformance_command_rejects_unknown_envs_before_starting(capsys):
    assert cli_main(["conformance", "example_single_tool_cal"]) == 2
    err = capsys.readouterr().err
    assert "unknown NeMo Gym environment 'example_single_tool_cal'" in err
    assert "example_single_tool_call" in err  # the close match


@pytest.mark.parametrize("kind", ["train", "validation"])
def test_dataset_choice_not_on_disk_says_how_to_get_it(nemo_venv, kind):
    env = nemo_gym_env.load_environment(nemo_env="mcqa,example_single_tool_call", dataset=kind)
    with pytest.raises(ConfigError, match=f"the {kind} dataset of 'mcqa' is not installed") as e:
        list(env.taskset)
    assert "ng_download_dataset_from_hf" in str(e.value) or "GitLab" in str(e.value)


def test_dataset_choice_example_loads_every_env_with_its_own_agent(nemo_venv):
    env = nemo_gym_env.load_environment(nemo_env=list(CI_ENVS), dataset="example")
    catalog = Catalog(nemo_venv)
    tasks = list(env.taskset)
    for name in CI_ENVS:
        spec = catalog.env(name)
        lines = [x for x in spec.dataset("example").read_text().splitlines() if x.strip()]
        mine = [t for t in tasks if t.data.name.startswith(f"{name}/example:")]
        assert len(mine) == len(lines)
        assert {t.data.agent for t in mine} == {spec.agent.name}


def test_recordings_without_the_task_fields_are_named_a_gap_in_the_recording(nemo_venv):
    # math_advanced_calculations' recordings carry no ground_truth and their prompts are in no
    # example row: the row cannot be rebuilt, and the mismatch must say so (not "error: 500").
    catalog = Catalog(nemo_venv)
    spec = catalog.env("math_advanced_calculations")
    examples = example_rows(spec)
    rec = load_recordings(spec.example_rollouts, spec.name)[0]
    row, notes = replay_row(rec, spec, examples)
    assert "ground_truth" not in row
    assert [n for n in notes if n.startswith(LACKS_FIELDS)] == [
        f"{LACKS_FIELDS} breadth, depth, ground_truth, id (every example row has them; its "
        "prompt is in no example row)"
    ]
    result = RowResult(rec.id, rec.reward, error="agent /run answered 500", notes=notes)
    explain(result, set(), "0.4.0")
    assert result.reason is not None and result.reason.startswith("gap in the recording")
    # A recording whose prompt is an example row is rebuilt from that row's keys: no note.
    mcqa = catalog.env("mcqa")
    rec = load_recordings(mcqa.example_rollouts, "mcqa")[0]
    row, notes = replay_row(rec, mcqa, example_rows(mcqa))
    assert notes == [] and set(row) == set(example_rows(mcqa)[0]) | {"agent_ref"}


def test_a_start_error_is_reported_by_its_telling_line():
    # The shape of a real one (NeMo Gym 0.7.0, prime_agent_math): a wrapper line, the log tail
    # with NeMo Gym's console-wrapped error, then our supervisor's teardown lines.
    text = """the shared NeMo Gym stack host exited with status 1 before it was ready; log tail:
stack_host: NeMo Gym's ng_run exited with status 1; log tail:
--- ng_run (ng_run.log) ---
[vf-nemogym supervisor] started pid 25399: gym
Error: Config value
'prime_agent_math_agent.responses_api_agents.prime_agent.model' references
'policy_model_name', which is not set after merging.
Provide it via a CLI override, in env.yaml, or in a config you pass via
[vf-nemogym supervisor] teardown complete"""
    assert start_error_line(text) == (
        "Error: Config value 'prime_agent_math_agent.responses_api_agents.prime_agent.model' "
        "references 'policy_model_name', which is not set after merging."
    )
    died = "host exited with status 1\nstack_host: NeMo Gym server 'x' died (ng_run exit 1)\n"
    assert start_error_line(died) == "stack_host: NeMo Gym server 'x' died (ng_run exit 1)"


def test_known_reasons_apply_to_both_layouts_of_an_environment():
    # 0.7.0 ships blackjack in both layouts; its unseeded deals are the same property in both.
    for recording in ("blackjack:2", "environments/blackjack:2"):
        result = RowResult(recording, 1.0, reward=-1.0)
        explain(result, set(), "0.7.0")
        assert result.reason == KNOWN_REASONS["blackjack"]
    # A release's rescored recording gets its reason only with the reward that release gives.
    (reward, why) = RESCORED["0.7.0"]["mcqa:3"]
    result = RowResult("mcqa:3", 0.0, reward=reward)
    explain(result, set(), "0.7.0")
    assert result.reason == why
    result = RowResult("mcqa:3", 0.0, reward=reward)
    explain(result, set(), "0.4.0")
    assert result.reason == f"reward {reward!r}, recorded 0.0"


async def test_long_lists_run_as_successive_stacks_in_order(monkeypatch):
    stacks: list[list[str]] = []

    async def fake(envs, **options):
        stacks.append(list(envs))
        return [EnvReport(e) for e in envs]

    monkeypatch.setattr(conformance_run, "run_conformance", fake)
    names = [f"env{i}" for i in range(STACK_ENVS * 2 + 1)]
    reports = await conformance_run.run_in_stacks([*names, "env0"], concurrency=1)
    assert [r.env for r in reports] == names
    assert [len(s) for s in stacks] == [STACK_ENVS, STACK_ENVS, 1]


async def test_a_stack_that_does_not_start_costs_only_the_environments_that_broke_it(monkeypatch):
    runs: list[list[str]] = []

    async def fake(envs, **options):
        runs.append(list(envs))
        if "broken" in envs:
            raise StackError("NeMo Gym stack exited during start (exit 1)\nProcess `broken` died")
        return [EnvReport(e) for e in envs]

    monkeypatch.setattr(conformance_run, "run_conformance", fake)
    names = ["env0", "broken", *[f"env{i}" for i in range(1, STACK_ENVS + 1)]]
    reports = await conformance_run.run_in_stacks(names, concurrency=1)
    assert [r.env for r in reports] == names
    # The failed batch runs again one per stack; the next batch is not affected.
    assert runs == [names[:STACK_ENVS], *([n] for n in names[:STACK_ENVS]), names[STACK_ENVS:]]
    (failed,) = [r for r in reports if r.start_error]
    assert failed.env == "broken" and failed.start_error == "Process `broken` died"
    assert "| broken | - | - | - | stack did not start: Process `broken` died |" in (
        format_report(reports)
    )


def test_gymnasium_recordings_lose_the_reset_observation_and_find_their_seeded_row(nemo_venv):
    # gymnasium_agent's /run echoes the row's input with the reset observation appended; grl's
    # five example rows share one prompt and differ by seed: `_ng_task_index` names the row.
    spec = Catalog(nemo_venv).env("grl_sokoban")
    examples = example_rows(spec)
    assert len({json.dumps(x["responses_create_params"]["input"]) for x in examples}) == 1
    for rec in load_recordings(spec.example_rollouts, spec.name):
        row, notes = replay_row(rec, spec, examples)
        example = examples[rec.row["_ng_task_index"]]
        assert row["seed"] == example["seed"] and row["dim_room"] == example["dim_room"]
        recorded_input = rec.row["responses_create_params"]["input"]
        assert row["responses_create_params"]["input"] == recorded_input[:-1]
        assert recorded_input[-1]["content"].startswith("Sokoban board:")
        assert notes == ["the reset observation the gymnasium agent appended was removed"]
    # Same empty input for every SciCode row: the task fields tell the rows apart.
    scicode = Catalog(nemo_venv).env("scicode")
    for rec in load_recordings(scicode.example_rollouts, "scicode"):
        row, _ = replay_row(rec, scicode, example_rows(scicode))
        example = next(x for x in example_rows(scicode) if x["problem_id"] == row["problem_id"])
        assert row["sub_steps"] == example["sub_steps"]


def test_errors_in_the_report_do_not_carry_the_proxy_secret():
    # An agent's 500 echoes the request, whose metadata carries the proxy's route and secret.
    secret = "s3-cr_et-0123456789"
    body = json.dumps({"metadata": {"vf_nemogym_route": "r1", "vf_nemogym_secret": secret}})
    redact.protect(secret)  # what a running proxy does with its secret
    try:
        for text in (f"/run answered 500: {body}", f"/run answered 500: {json.dumps(body)}"):
            line = error_line(text)
            assert secret not in line and "vf_nemogym_secret" in line and "r1" in line
            assert redact.REDACTED in line
    finally:
        redact.forget(secret)
    # In its wire form a secret is redacted live or not (another user's, a finished one's);
    # elsewhere only live secrets are.
    assert secret not in error_line(body)
    assert secret in error_line(f"a text that mentions {secret}")


async def test_a_start_failure_reaches_run_conformance_as_a_stack_error(nemo_venv):
    """The env fails its rollouts when its stack cannot start (an env server must not die);
    conformance still sees the start failure as one, so `run_in_stacks` can isolate it. Here
    the start fails at once: the proxy's port is taken."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        def load_env(**fields):
            return nemo_gym_env.load_environment(**fields, proxy_port=port)

        with pytest.raises(StackError, match=f"cannot listen on 127.0.0.1:{port}"):
            await run_conformance(
                ["example_single_tool_call"],
                load_env=load_env,
                nemo_gym_version=nemo_venv.nemo_gym_version,
            )


def test_a_row_rebuilt_without_its_example_row_drops_what_verify_added(nemo_venv):
    """omniscience's recordings are of prompts no example row has: the rebuilt row keeps the
    task fields (the verifier reads `question`, `expected_answer`) and drops the verdict fields
    `/verify` added, which omniscience's verifier would get twice and fail on."""
    spec = Catalog(nemo_venv).env("omniscience")
    examples = example_rows(spec)
    for rec in load_recordings(spec.example_rollouts, "omniscience"):
        assert {"verdict", "judge_output", "is_correct"} <= set(rec.row)
        row, _ = replay_row(rec, spec, examples)
        assert {"question", "expected_answer", "responses_create_params"} <= set(row)
        assert set(row) <= set().union(*examples)
        assert not {"verdict", "judge_output", "is_correct", "extracted_answer"} & set(row)


def _replayed_episode(rec_row: dict, agent: str, ok: bool = True) -> dict:
    """The episode a replay of `rec_row` leaves in traces.jsonl when `/run` answers exactly the
    recording (the harness's own `record`), or a failed one."""
    trace = Trace(task=TraceTask(type="NeMoGymTask", data={}), agent=AgentInfo(config={}))
    if ok:
        record(trace, rec_row)
    data = {"name": "rows:1", "agent": agent, "row": {}}
    as_json = {"task": {"type": "NeMoGymTask", "data": data}, "info": trace.info,
               "errors": [] if ok else [{"type": "AgentRunError", "message": "x"}]}  # fmt: skip
    return {"task": as_json["task"], "ok": ok, "traces": [as_json]}


def test_metrics_inputs_of_a_faithful_replay_equal_the_recordings(nemo_venv):
    # mcqa's recordings, replayed faithfully: NeMo Gym's aggregator gets the same rollouts from
    # both sides, so any difference in its figures comes from the rollouts alone.
    recordings = load_recordings(Catalog(nemo_venv).env("mcqa").example_rollouts, "mcqa")
    agents = {r.id: "mcqa_simple_agent" for r in recordings}
    episodes = {r.id: _replayed_episode(r.row, "mcqa_simple_agent") for r in recordings}
    numbers = numbering(recordings, agents)
    theirs = recorded_results(recordings, agents, numbers)
    ours = replayed_results(recordings, episodes, numbers)
    assert list(theirs) == list(ours) == ["mcqa_simple_agent"]
    assert len(theirs["mcqa_simple_agent"]) == len(recordings) == 5
    assert ours == theirs
    for result in theirs["mcqa_simple_agent"]:
        assert "responses_create_params" not in result
        assert set(result["response"]) <= {"usage", "incomplete_details"}
    # A failed replay is left out on our side, a failed recording on NeMo Gym's.
    failed = recordings[1]
    episodes[failed.id] = _replayed_episode(failed.row, "mcqa_simple_agent", ok=False)
    assert len(replayed_results(recordings, episodes, numbers)["mcqa_simple_agent"]) == 4
    failed.row["_ng_failure_class"] = "judge_failed"
    assert len(recorded_results(recordings, agents, numbers)["mcqa_simple_agent"]) == 4


def test_metrics_keep_the_recorded_task_and_rollout_indices_unless_they_repeat(nemo_venv):
    recordings = load_recordings(Catalog(nemo_venv).env("mcqa").example_rollouts, "mcqa")
    numbers = [(1, 1), (0, 0), (1, 0), (0, 1), (2, 0)]
    for rec, (task, rollout) in zip(recordings, numbers, strict=True):
        rec.row["_ng_task_index"], rec.row["_ng_rollout_index"] = task, rollout
    agents = {r.id: "a" for r in recordings}
    episodes = {r.id: _replayed_episode(r.row, "a") for r in recordings}

    def indices(side: dict) -> list[tuple[int, int]]:
        return [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in side["a"]]

    given = numbering(recordings, agents)
    for side in (recorded_results(recordings, agents, given),
                 replayed_results(recordings, episodes, given)):  # fmt: skip
        assert indices(side) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    # A repeated pair (NeMo Gym's aggregator refuses it) or a recording without indices:
    # the agent's recordings are numbered by position, each its own task.
    for change in ({"_ng_task_index": 1, "_ng_rollout_index": 1}, {"_ng_task_index": None}):
        recordings[4].row.update(change)
        by_position = numbering(recordings, agents)
        assert [by_position[r.id] for r in recordings] == [(i, 0) for i in range(5)]
        assert indices(recorded_results(recordings, agents, by_position)) == [
            (i, 0) for i in range(5)
        ]


def test_aggregate_answers_compare_figure_by_figure_model_figures_aside():
    recorded = {
        "agent_ref": {"name": "a"},
        "agent_metrics": {"mean/reward": 0.6, "pass@1/accuracy": 60.0, "mean/input_tokens": 88.0},
        "key_metrics": {"mean/reward": 0.6},
        "group_level_metrics": [{"mean/reward": 1.0}, {"mean/reward": 0.2}],
        "perf_summary": {"seconds": 3.0},
    }
    same = json.loads(json.dumps(recorded)) | {"agent_ref": {"name": "b"}}
    same["agent_metrics"]["mean/reward"] = 0.6 + 1e-12  # summed in another order
    same["agent_metrics"]["mean/input_tokens"] = 0.0  # the replay reports no usage
    same["perf_summary"] = {"seconds": 9.0}
    assert compare_answers(recorded, same) == (5, 2, {})
    other = json.loads(json.dumps(same))
    other["key_metrics"]["mean/reward"] = 0.8
    other["group_level_metrics"].pop()
    other["agent_metrics"]["majority@1/accuracy"] = float("nan")
    figures, aside, differing = compare_answers(recorded, other)
    assert differing == {
        "agent_metrics.majority@1/accuracy": (None, other["agent_metrics"]["majority@1/accuracy"]),
        "group_level_metrics.1.mean/reward": (0.2, None),
        "key_metrics.mean/reward": (0.6, 0.8),
    }
    assert (figures, aside) == (6, 2)
    assert model_figure("agent_metrics.std/output_tokens") and not model_figure("key_metrics.x")


def test_the_report_gives_each_agents_metrics_comparison_and_why():
    rows = [RowResult("mcqa:1", 1.0, reward=1.0), RowResult("mcqa:2", 0.0, error="boom")]
    equal = MetricsComparison("x_agent", recorded=5, replayed=5, figures=40, set_aside=12)
    differs = MetricsComparison(
        "mcqa_simple_agent", recorded=2, replayed=1, figures=30,
        differing={"key_metrics.mean/reward": (0.5, 1.0)},
        reason=metrics_reason(rows, {"key_metrics.mean/reward": (0.5, 1.0)}),
    )  # fmt: skip
    lost = MetricsComparison("y_agent", recorded=5, replayed=0, error="no replayed rollouts")
    reports = [
        EnvReport("mcqa", rows=rows, metrics=[differs]),
        EnvReport("x", metrics=[equal]),
        EnvReport("y", metrics=[lost]),
    ]
    text = format_report(reports)
    assert "| x | x_agent | 5 / 5 | 40 | 0 | equal |" in text
    assert (
        "| mcqa | mcqa_simple_agent | 2 / 1 | 30 | 1 | the replay differs from the recording: "
        "1 replayed rollout(s) failed (left out) (see the mismatches); e.g. "
        "`key_metrics.mean/reward` 0.5 / 1.0 |"
    ) in text
    assert "| y | y_agent | 5 / 0 | - | - | not compared: no replayed rollouts |" in text
    assert "Aggregate metrics equal for 1 of 3 agents." in text
    assert [m["equal"] for r in reports for m in r.to_json()["metrics"]] == [False, True, False]
    matched = [RowResult("x:1", 1.0, reward=1.0)]
    new_fields = {"agent_metrics.mean/exact_match": (None, 1.0),
                  "group_level_metrics.0.rollout_infos.0.exact_match": (None, 1.0),
                  "agent_metrics.mean/old_score": (0.5, None)}  # fmt: skip
    assert metrics_reason(matched, new_fields) == (
        "every reward matched; the release's verifier returns fields the recordings lack "
        "(exact_match); the recordings have fields it no longer returns (old_score)"
    )
    unexplained = {"agent_metrics.mean/accuracy": (50.0, 60.0)}
    assert metrics_reason(matched, unexplained) == (
        "every reward matched, yet figures of accuracy differ (not explained)"
    )
    # An agent two environments' rows ran on is named with both.
    shared = MetricsComparison("cal_agent", 10, 10, figures=9, also=["environments/calendar"])
    text = format_report([EnvReport("calendar_v2", metrics=[shared])])
    assert "| calendar_v2, environments/calendar | cal_agent | 10 / 10 | 9 | 0 | equal |" in text


async def test_a_stack_that_did_not_start_is_split_without_starting_it_again(monkeypatch):
    # Ray's node timeout was already tried again by the start itself (`start_stack`,
    # tests/nemo/test_stack_start.py): conformance does not multiply those starts.
    runs: list[list[str]] = []
    ray = "ng_run exited with status 1: Exception: The current node timed out during startup."

    async def fake(envs, **options):
        runs.append(list(envs))
        if len(runs) in {1, 4}:  # each batch's one start
            raise StackError(ray)
        return [EnvReport(e) for e in envs]

    monkeypatch.setattr(conformance_run, "run_conformance", fake)
    monkeypatch.setattr(conformance_run, "STACK_ENVS", 2)
    reports = await conformance_run.run_in_stacks(["a", "b", "c", "d"], concurrency=1)
    assert runs == [["a", "b"], ["a"], ["b"], ["c", "d"], ["c"], ["d"]]
    assert [r.env for r in reports] == ["a", "b", "c", "d"]
    assert not any(r.start_error for r in reports)
