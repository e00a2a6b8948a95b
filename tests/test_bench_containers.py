"""The container benchmark's committed result (fast tier, nothing started): native NeMo Gym and
nemo-gym-env gave every row the same reward, the one its fixer case calls for, and the docs quote
the result's table."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import containers

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks/results/2026-11-27-containers.json"


def test_rewards_are_equal_native_and_ours() -> None:
    result = json.loads(RESULT.read_text())
    assert set(result["envs"]) >= {"swebench_pro", "terminal_bench_2_1"}
    for name, entry in result["envs"].items():
        native, ours = entry["native"], entry["ours"]
        assert native["rewards"] == ours["rewards"] == result["expected_rewards"], name
        # Every timed pass too, and nothing of either side was left running.
        for rewards in native["timed_rewards"] + ours["timed_rewards"]:
            assert rewards == result["expected_rewards"], name
        assert native["containers_left"] == ours["containers_left"] == 0, name


def test_table_renders_and_the_docs_quote_it() -> None:
    """docs/containers.md's container table is `table()` of the committed result, row for row (a
    rerun that changes a figure fails here until the page quotes it)."""
    result = json.loads(RESULT.read_text())
    lines = containers.table(result)
    assert len(lines) == 2 + len(result["envs"])
    assert lines[2].startswith("| swebench_pro | 1, 0 | 1, 0 | ")
    doc = (ROOT / "docs/containers.md").read_text().splitlines()
    assert [row for row in lines if row not in doc] == []


def test_table_shows_a_failed_side() -> None:
    ours = {"rewards": [1.0, 0.0], "s_per_rollout": 2.345}
    result = {"envs": {"x": {"native": {"error": "boom"}, "ours": ours}}}
    assert containers.table(result)[2] == "| x | error | 1, 0 | error | 2.3 |"
