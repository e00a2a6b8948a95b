"""Conformance on the real chain: NeMo Gym's own recorded rollouts of four environments
(single-step, multi-step tool calls, gymnasium multi-turn, mcqa), replayed through nemo-gym-env
on ONE stack, must score exactly the recorded rewards. Nothing is mocked; the model is the
replay policy answering with what the recorded model said."""

from __future__ import annotations

import json

import pytest

import nemo_gym_env
from verifiers_nemogym.catalog import Catalog
from verifiers_nemogym.cli import main as cli_main
from verifiers_nemogym.conformance import CI_ENVS, format_report, run_conformance
from verifiers_nemogym.errors import ConfigError


async def test_recorded_rollouts_replay_with_reward_parity_on_one_stack(nemo_runtime):
    reports = await run_conformance(CI_ENVS, concurrency=8)
    catalog = Catalog(nemo_runtime)
    assert [r.env for r in reports] == list(CI_ENVS)
    for report in reports:
        lines = catalog.env(report.env).example_rollouts.read_text().splitlines()
        recorded = [json.loads(line)["reward"] for line in lines if line.strip()]
        assert len(report.rows) == len(recorded) > 0, report.env
        assert report.skipped is None and report.errors == 0, format_report(reports)
        assert [row.reward for row in report.rows] == recorded, format_report(reports)
        assert report.matches == len(recorded)
    table = format_report(reports)
    assert f"| **total** | {sum(len(r.rows) for r in reports)} |" in table
    assert "Mismatches" not in table
    # Not a constant verifier: mcqa's recordings include wrong answers, replayed as wrong.
    assert {row.reward for row in reports[-1].rows} == {0.0, 1.0}


def test_conformance_command_rejects_unknown_envs_before_starting(capsys):
    assert cli_main(["conformance", "example_single_tool_cal"]) == 2
    err = capsys.readouterr().err
    assert "unknown NeMo Gym environment 'example_single_tool_cal'" in err
    assert "example_single_tool_call" in err  # the close match


@pytest.mark.parametrize("kind", ["train", "validation"])
def test_dataset_choice_not_on_disk_says_how_to_get_it(nemo_runtime, kind):
    env = nemo_gym_env.load_environment(nemo_env="mcqa,example_single_tool_call", dataset=kind)
    with pytest.raises(ConfigError, match=f"the {kind} dataset of 'mcqa' is not installed") as e:
        list(env.taskset)
    assert "ng_download_dataset_from_hf" in str(e.value) or "GitLab" in str(e.value)


def test_dataset_choice_example_loads_every_env_with_its_own_agent(nemo_runtime):
    env = nemo_gym_env.load_environment(nemo_env=list(CI_ENVS), dataset="example")
    catalog = Catalog(nemo_runtime)
    tasks = list(env.taskset)
    for name in CI_ENVS:
        spec = catalog.env(name)
        lines = [x for x in spec.dataset("example").read_text().splitlines() if x.strip()]
        mine = [t for t in tasks if t.data.name.startswith(f"{name}/example:")]
        assert len(mine) == len(lines)
        assert {t.data.agent for t in mine} == {spec.agent.name}
