"""Conformance on the real chain: NeMo Gym's own recorded rollouts of four environments
(single-step, multi-step tool calls, gymnasium multi-turn, mcqa), replayed through nemo-gym-env
on ONE stack, must score exactly the recorded rewards. Nothing is mocked; the model is the
replay policy answering with what the recorded model said."""

from __future__ import annotations

import json

import nemo_gym_env
from verifiers_nemogym.conformance.report import format_report
from verifiers_nemogym.conformance.run import run_conformance
from verifiers_nemogym.conformance.tables import CI_ENVS, RESCORED
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.venv import BELOW_FLOOR_ENV_VAR


async def test_recorded_rollouts_replay_with_reward_parity_on_one_stack(any_nemo_venv, monkeypatch):
    if any_nemo_venv.below_floor:  # the opt-in, as `nemo-gym-env --allow-python-below-floor`
        monkeypatch.setenv(BELOW_FLOOR_ENV_VAR, "1")
    reports = await run_conformance(
        CI_ENVS,
        load_env=nemo_gym_env.load_environment,
        nemo_gym_version=any_nemo_venv.nemo_gym_version,
        python=str(any_nemo_venv.python),
        concurrency=8,
    )
    # Recordings of these environments the release's own verifier scores anew (0.7.0: mcqa:3),
    # with their reason.
    ours = {
        k: v
        for k, v in RESCORED.get(any_nemo_venv.nemo_gym_version, {}).items()
        if k.rsplit(":", 1)[0] in CI_ENVS
    }
    rescored = {k: v[0] for k, v in ours.items()}
    catalog = Catalog(any_nemo_venv)
    assert [r.env for r in reports] == list(CI_ENVS)
    for report in reports:
        lines = catalog.env(report.env).example_rollouts.read_text().splitlines()
        recorded = [json.loads(line)["reward"] for line in lines if line.strip()]
        expected = [rescored.get(f"{report.env}:{i}", r) for i, r in enumerate(recorded, 1)]
        assert len(report.rows) == len(recorded) > 0, report.env
        assert report.skipped is None and report.errors == 0, format_report(reports)
        assert [row.reward for row in report.rows] == expected, format_report(reports)
        assert report.matches == sum(e == r for e, r in zip(expected, recorded, strict=True))
    table = format_report(reports)
    assert f"| **total** | {sum(len(r.rows) for r in reports)} |" in table
    assert ("Mismatches" in table) == bool(rescored)
    for recording, (_, why) in ours.items():
        assert f"`{recording}`" in table and why in table
    # Not a constant verifier: mcqa's recordings include wrong answers, replayed as wrong.
    assert {row.reward for row in reports[-1].rows} == {0.0, 1.0}
