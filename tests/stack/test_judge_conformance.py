"""Conformance of LLM-judge environments on the real chain: NeMo Gym 0.4.0's recorded rollouts
of three judge environments replayed on ONE stack, the policy by the replay policy and the judge
by the replay judge, must score exactly the recorded rewards, each recorded judge call answered
from its recording. The three cover the ways a judge is called and recorded:
equivalence_llm_judge (Responses judge calls, which NeMo Gym's inference_provider converts to
Chat Completions; the whole request recorded), abstention (Responses; only the judge's text
recorded) and arena_judge (Chat Completions; two side-swapped calls per rollout, texts only).
Their rewards are the judge's verdicts and the recordings hold several verdicts, so a judge
answering anything but each call's recorded output loses parity."""

from __future__ import annotations

import json

import nemo_gym_env
from verifiers_nemogym.conformance.report import format_report
from verifiers_nemogym.conformance.run import run_conformance
from verifiers_nemogym.conformance.tables import JUDGE_REPLAY
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.policies.replay import load_recordings
from verifiers_nemogym.policies.replay_judge import judge_entries

ENVS = ["equivalence_llm_judge", "abstention", "arena_judge"]


async def test_judge_environments_replay_policy_and_judge_with_reward_parity(
    nemo_venv: NeMoGymVenv,
) -> None:
    assert set(ENVS) <= set(JUDGE_REPLAY["0.4.0"])
    reports = await run_conformance(
        ENVS,
        load_env=nemo_gym_env.load_environment,
        nemo_gym_version=nemo_venv.nemo_gym_version,
        python=str(nemo_venv.python),
    )
    catalog = Catalog(nemo_venv)
    assert [r.env for r in reports] == ENVS
    table = format_report(reports)
    for report in reports:
        path = catalog.env(report.env).example_rollouts
        recorded = [json.loads(line)["reward"] for line in path.read_text().splitlines()]
        assert len(report.rows) == len(recorded) > 0, report.env
        assert report.errors == 0, table
        assert [row.reward for row in report.rows] == recorded, table
        assert report.matches == len(recorded)
        # The judge decided: the recordings hold more than one verdict.
        assert len(set(recorded)) > 1, report.env
        # Every judge call the recordings keep was asked again and answered from them.
        entries = [e for rec in load_recordings(path, report.env) for e in judge_entries(rec)]
        assert report.judge_replies == len(entries) > 0, table
    assert "Mismatches" not in table
