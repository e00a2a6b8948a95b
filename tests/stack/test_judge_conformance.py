"""Conformance of LLM-judge environments on the real chain: NeMo Gym 0.4.0's recorded rollouts
of equivalence_llm_judge (Responses judge calls, converted to Chat Completions by NeMo Gym's
inference_provider) and simpleqa (Chat Completions judge calls, recording only the judge's text)
replayed on ONE stack, the policy by the replay policy and the judge by the replay judge, must
score exactly the recorded rewards. Both environments' rewards are the judge's verdict, and the
recordings hold right and wrong verdicts, so a judge answering anything but the recorded output
of each call loses parity."""

from __future__ import annotations

import json

import nemo_gym_env
from verifiers_nemogym.conformance import JUDGE_REPLAY, format_report, run_conformance
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.venv import NeMoGymVenv

ENVS = ["equivalence_llm_judge", "simpleqa"]


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
    for report in reports:
        lines = catalog.env(report.env).example_rollouts.read_text().splitlines()
        recorded = [json.loads(line)["reward"] for line in lines if line.strip()]
        assert len(report.rows) == len(recorded) > 0, report.env
        assert report.errors == 0, format_report(reports)
        assert [row.reward for row in report.rows] == recorded, format_report(reports)
        assert report.matches == len(recorded)
        # The judge decided: each environment's recordings hold both verdicts.
        assert {row.reward for row in report.rows} == {0.0, 1.0}, report.env
    assert "Mismatches" not in format_report(reports)
