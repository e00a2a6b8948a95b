"""`nemo-gym-env list`: an LLM-judge environment the judge conformance survey ran is listed as
running with a judge (naming the survey and its counts); one whose rows did not complete stays
"no", with the survey's counts and the reason; a judge environment never surveyed stays "no"."""

from __future__ import annotations

import pytest

from verifiers_nemogym.cli import main
from verifiers_nemogym.conformance.tables import WITH_JUDGE, runs_here
from verifiers_nemogym.nemo.venv import NeMoGymVenv


def _rows(printed: str) -> dict[str, list[str]]:
    lines = [line for line in printed.splitlines() if line.startswith("| ")]
    cells = [line.strip("| ").split(" | ") for line in lines]
    return {row[0]: row for row in cells[1:]}


def test_list_shows_judge_environments_the_judge_survey_ran(
    nemo_venv: NeMoGymVenv, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--nemo-gym-version", nemo_venv.nemo_gym_version, "list"]) == 0
    rows = _rows(capsys.readouterr().out)
    equivalence = rows["equivalence_llm_judge"]
    assert equivalence[3] == "needs --env.taskset.judge"
    assert equivalence[4] == WITH_JUDGE == "yes, with --env.taskset.judge.*"
    assert equivalence[5] == (
        "ran with a judge named by --env.taskset.judge.*: judge conformance survey (NeMo Gym "
        "0.4.0, the replay judge): 5/5 rows completed, 5 with the recorded reward"
    )
    assert rows["simpleqa"][4] == WITH_JUDGE
    terminus = rows["terminus_judge"]
    assert terminus[4] == "no"
    assert terminus[5].startswith(
        "judge conformance survey (NeMo Gym 0.4.0, the replay judge): 0/5 rows completed"
    )
    assert "judge replay gap" in terminus[5]
    # Judge environments the survey never ran keep their reason.
    assert rows["jailbreak_detection"][4:] == ["no", "an LLM judge model server in its config"]


def test_each_release_reads_its_own_judge_survey() -> None:
    judge = {"judge": "an LLM judge model server in its config"}
    # xstest: 2/5 completed on 0.4.0, none on 0.5.0 (its own survey).
    assert runs_here("xstest", None, judge, "0.4.0")[0] == WITH_JUDGE
    assert runs_here("xstest", None, judge, "0.5.0")[0] == "no"
    # 0.5.1 surveyed four judge environments only: the others are not taken from elsewhere.
    assert runs_here("arena_judge", None, judge, "0.5.1")[0] == WITH_JUDGE
    assert runs_here("omniscience", None, judge, "0.5.1") == ("no", judge["judge"])
    # A release without a survey (a newer one) is judged by the newest older one's, named.
    assert "(NeMo Gym 0.7.0," in runs_here("aalcr", None, judge, "0.9.0")[1]
    # A problem with the entry wins.
    assert runs_here("aalcr", "broken", judge) == ("no", "broken")


def test_nemo_user_sim_is_listed_with_why_it_does_not_run() -> None:
    """NeMo Gym's UserSim: the user is played by a model server of its own (`user_model`), not
    the policy; its files look like a harness's (`${policy_base_url}`), the reason is the data's."""
    runs, why = runs_here("nemo_user_sim", None, {"harness": "a coding-agent CLI"}, "0.7.0")
    assert runs == "no"
    assert why.startswith("besides the policy (its `policy_model`, the assistant's seat)")
    assert "`user_model` plays the user" in why
