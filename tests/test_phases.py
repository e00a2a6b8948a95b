"""A rollout's phases (verifiers_nemogym/phases.py) from its `/run` and model-call times.

That they are on a real container rollout's trace and add up to its time is tested in
tests/stack/containers/test_containers.py."""

from __future__ import annotations

from verifiers_nemogym.phases import PHASES, rollout_phases


def test_phases_split_the_run_at_the_first_and_last_call() -> None:
    phases = rollout_phases(100.0, 160.0, [(150.0, 151.0), (152.5, 153.0)])
    assert phases == {"start": 50.0, "model": 1.5, "tools": 1.5, "finish": 7.0,
                      "run": 60.0, "model_calls": 2}  # fmt: skip
    assert sum(float(phases[p]) for p in PHASES) == phases["run"]


def test_overlapping_calls_count_once_and_calls_are_clipped_to_the_run() -> None:
    phases = rollout_phases(0.0, 10.0, [(2.0, 5.0), (3.0, 4.0), (4.5, 6.0), (9.0, 12.0)])
    assert (phases["model"], phases["tools"]) == (5.0, 3.0)  # [2, 6] and [9, 10]
    assert (phases["start"], phases["finish"]) == (2.0, 0.0)
    assert sum(float(phases[p]) for p in PHASES) == phases["run"] == 10.0


def test_a_run_without_a_call_is_all_start() -> None:
    assert rollout_phases(5.0, 7.5, []) == {
        "start": 2.5, "model": 0.0, "tools": 0.0, "finish": 0.0, "run": 2.5, "model_calls": 0
    }  # fmt: skip
