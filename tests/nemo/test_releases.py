"""Every NeMo Gym release from 0.4.0 to 0.7.0 is selectable: its declared Python floor is the one
`KNOWN_RELEASES` states (read from the release's own metadata), and its environments list and
its rows load from its files alone (no runtime). Rollouts on each release:
tests/stack/test_releases.py."""

from __future__ import annotations

import pytest

from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.release import KNOWN_RELEASES, python_floor, release_files
from verifiers_nemogym.taskset import NeMoGymTaskset, NeMoGymTasksetConfig

RELEASES = ["0.4.0", "0.5.0", "0.5.1", "0.6.0", "0.7.0"]


def test_every_release_from_040_to_070_is_known():
    assert sorted(KNOWN_RELEASES) == RELEASES


@pytest.mark.parametrize("version", RELEASES)
def test_a_release_lists_its_environments_and_loads_rows_from_its_files(version: str):
    files = release_files(version)
    assert python_floor(version, files.root) == KNOWN_RELEASES[version]  # its metadata says so
    catalog = Catalog(files)
    names = catalog.all_names()
    assert len(names) > 90, (version, len(names))
    assert {"example_single_tool_call", "mcqa", "simpleqa"} <= set(names)
    taskset = NeMoGymTaskset(
        NeMoGymTasksetConfig(
            id="nemo-gym-env", nemo_env=["example_single_tool_call", "mcqa"],
            nemo_gym_version=version,
        )
    )  # fmt: skip
    tasks = list(taskset)
    assert {t.data.agent for t in tasks} == {
        "example_single_tool_call_simple_agent",
        "mcqa_simple_agent",
    }
    assert all(t.data.row["responses_create_params"]["input"] for t in tasks)
