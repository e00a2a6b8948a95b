"""The releases between 0.4.0 and 0.7.0 (0.5.0, 0.5.1, 0.6.0: this machine's Python 3.13.0 with
the below-floor opt-in) on a real stack: rollouts of a judge-free environment score NeMo Gym's
reward, and a judge that fails turns every rollout of a judge environment into an error naming
the judge, never the score the release gives such a rollout (a 200 with `reward: 0.0` and
`_ng_failure_class: judge_failed`). One shared stack (the default) per release, two rows per
environment; it stops as its last user leaves (idle grace 0).

0.4.0 and 0.7.0, the releases every other stack test runs, are not repeated here: their scored
rollouts are tests/stack/test_e2e.py's, their failing judge (0.4.0's 500 from `/verify`, 0.7.0's
`judge_failed` and `mask_sample: true`) tests/stack/test_judges.py's
`test_judge_environments_grade_with_the_named_judge_on_both_releases`."""

from __future__ import annotations

import asyncio

import pytest
from helpers.evals import error_text, model_context
from helpers.processes import gone

import nemo_gym_env
from verifiers_nemogym.nemo.release import RELEASES as TABLE
from verifiers_nemogym.nemo.release import parse_version
from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR
from verifiers_nemogym.nemo.venv import NeMoGymVenv, ensure_venv
from verifiers_nemogym.policies.judge import ScriptedJudge
from verifiers_nemogym.policies.scripted import ScriptedPolicy
from verifiers_nemogym.stack_access import SharedStack

RELEASES = sorted(set(TABLE) - {"0.4.0", "0.7.0"}, key=parse_version)
"""Every known release but the two every other stack test runs (0.5.0, 0.5.1, 0.6.0): surveyed
(tests/survey.sh), each repeating on a release between them what CI shows on 0.4.0 and 0.7.0."""
JUDGE_ENV = "simpleqa"  # grades with NeMo Gym's judge on every release


@pytest.fixture(
    scope="module",
    params=[pytest.param(v, marks=pytest.mark.survey) for v in RELEASES],
)
def release(request: pytest.FixtureRequest) -> NeMoGymVenv:
    """The release's runtime: 0.5-0.7 (>= 3.13.14) need the opt-in here."""
    return ensure_venv(request.param, allow_below_floor=True)


async def test_a_release_scores_rollouts_and_a_failing_judge_is_an_error(
    policy: ScriptedPolicy, release: NeMoGymVenv
) -> None:
    version = release.nemo_gym_version
    async with ScriptedJudge(verdict="A") as judge:
        env = nemo_gym_env.load_environment(
            nemo_env=f"example_single_tool_call,{JUDGE_ENV}",
            nemo_gym_version=version,
            python=str(release.python),
            allow_python_below_floor=release.below_floor,
            judge={"base_url": judge.base_url, "model": "scripted-judge", "api_key_var": ""},
            stack_idle_grace=0,
        )
        assert env.taskset.nemo_venv == release
        tasks = list(env.taskset)[:4]  # environments in turn: two rows of each
        ctx = model_context(policy)
        async with env.serving():
            assert isinstance(env.stack, SharedStack)  # the default: the machine's shared stack
            marker = f"{MARKER_ENV_VAR}={env.stack_marker}"
            judge.fail_status = 503  # after the start-up check: every grading call fails
            eps = await asyncio.gather(*(env.run_episode(t, ctx) for t in tasks))
        assert await gone(marker) == []
    judged = [t.data.agent == f"{JUDGE_ENV}_simple_agent" for t in tasks]
    assert judged == [False, True, False, True]
    for episode, is_judged in zip(eps, judged, strict=True):
        trace = episode.traces[0]
        assert trace.info["nemo_gym_runtime"]["nemo_gym"] == version
        if not is_judged:
            assert episode.ok and trace.reward == 1.0, error_text(episode)
            continue
        text = error_text(episode)
        assert not episode.ok and trace.rewards.get("nemo_gym") is None, version
        assert "the judge scripted-judge at" in text and "failed: 503" in text, text
        # The release's own signal is named too, not only the judge rule's finding.
        assert "_ng_failure_class: judge_failed" in text, text
