"""The container benchmark's committed result (fast tier, nothing started): native NeMo Gym and
nemo-gym-env gave every row the same reward, the one its fixer case calls for, at every level of
rollouts in flight; each side's phases add up; and the docs quote the result's tables."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import containers
from verifiers_nemogym.phases import PHASES

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks/results/2026-11-28-containers.json"


def test_every_measured_side_scores_each_row_as_its_case_calls_for() -> None:
    """Every rollout of a side that ran, at every level, got the reward its fixer case calls
    for (so native and ours agree where both ran), and nothing of it was left running."""
    result = json.loads(RESULT.read_text())
    assert "rewards" in result["envs"]["terminal_bench_2_1"]["ours"]
    for name, entry in result["envs"].items():
        for side in (entry[s] for s in ("native", "ours") if "rewards" in entry[s]):
            assert side["rewards"] == result["expected_rewards"], name
            for rewards in side["timed_rewards"]:
                assert rewards == result["expected_rewards"], name
            assert side["containers_left"] == 0, name
            assert [int(k) for k in side["levels"]] == result["levels"], name


def test_each_sides_phases_add_up_to_its_rollouts_time() -> None:
    """The phases of `/run` add up to it, and `/run` plus the rest is the rollout's wall time."""
    result = json.loads(RESULT.read_text())
    for name, entry in result["envs"].items():
        for side in ("native", "ours"):
            if "phases" not in entry[side]:
                continue  # the side did not run (its error is in the result)
            phases = entry[side]["phases"]
            assert abs(sum(phases[p] for p in PHASES) - phases["run"]) <= 0.05, (name, side)
            assert abs(phases["run"] + phases["other"] - phases["wall"]) <= 0.05, (name, side)


def test_tables_render_and_the_docs_quote_them() -> None:
    """docs/containers.md quotes the parity table and docs/performance.md the phase and rate
    tables of the committed result, row for row (a rerun that changes a figure fails here until
    the pages quote it)."""
    result = json.loads(RESULT.read_text())
    parity = containers.table(result)
    assert len(parity) == 2 + len(result["envs"])
    assert parity[2].startswith("| terminal_bench_2_1 | ")
    doc = (ROOT / "docs/containers.md").read_text().splitlines()
    assert [row for row in parity if row not in doc] == []
    phases, rates = containers.phase_table(result), containers.rate_table(result)
    ran = [
        (n, s) for n, e in result["envs"].items() for s in ("native", "ours") if "phases" in e[s]
    ]
    assert len(phases) == 2 + len(ran)
    performance = (ROOT / "docs/performance.md").read_text().splitlines()
    assert [row for row in phases + rates if row not in performance] == []


def test_table_shows_a_failed_side() -> None:
    ours = {"rewards": [1.0, 0.0], "s_per_rollout": 2.345}
    result = {"envs": {"x": {"native": {"error": "boom"}, "ours": ours}}}
    assert containers.table(result)[2] == "| x | error | 1, 0 | error | 2.3 |"
    assert containers.phase_table(result) == containers.phase_table({"envs": {}})


def test_swe_next_scores_natively() -> None:
    """swe_next's row natively (the 2026-11-27 run's `/run` had answered 500 on it): both cases
    scored as the fixer calls for, each with its fix and final call, no container left."""
    result = json.loads((ROOT / "benchmarks/results/2026-11-28-swe-next-native.json").read_text())
    native = result["envs"]["swe_next"]["native"]
    assert native["rewards"] == result["expected_rewards"]
    assert native["calls_by_case"] == [{"fix": 1, "final": 1}] * len(result["cases"])
    assert native["containers_left"] == 0
