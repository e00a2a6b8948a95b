"""Every NeMo Gym release from 0.4.0 to 0.7.0 is selectable: its row of `RELEASES` states its
declared Python floor (read from the release's own metadata) and what it has (found in its
files), and its environments list and its rows load from its files alone (no runtime). Rollouts
on each release: tests/stack/test_releases.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.release import RELEASES, python_floor, release_files
from verifiers_nemogym.taskset import NeMoGymTaskset, NeMoGymTasksetConfig

RELEASES_HERE = ["0.4.0", "0.5.0", "0.5.1", "0.6.0", "0.7.0"]


def test_every_release_from_040_to_070_is_known():
    assert sorted(RELEASES) == RELEASES_HERE


@pytest.mark.parametrize("version", RELEASES_HERE)
def test_a_release_lists_its_environments_and_loads_rows_from_its_files(version: str):
    files = release_files(version)
    assert python_floor(version, files.root) == RELEASES[version].python_floor  # its metadata
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


def _mentions(folder: Path, text: str, but: str = "") -> bool:
    """Whether a Python file of `folder` (other than `but`) mentions `text`."""
    return any(
        text in path.read_text(errors="replace")
        for path in folder.rglob("*.py")
        if path.name != but
    )


@pytest.mark.parametrize("version", RELEASES_HERE)
def test_a_releases_row_says_what_its_files_have(version: str) -> None:
    """Each feature of a row, found (or not) in the release's own files. The features the
    library acts on (start CLI, readiness, spin-up deadline, pairing check, environment servers)
    are on from the release they were verified on, where the files first show them."""
    has = RELEASES[version]
    root = release_files(version).root
    code = root / "nemo_gym"
    assert has.readyz == _mentions(code, '"/readyz"')
    assert has.spinup_timeout == _mentions(code, "server_spinup_timeout_seconds")
    assert has.environment_servers == (root / "environment_servers").is_dir()
    assert has.gym_cli == has.environment_servers  # `gym env start` verified on 0.7.0 alone
    assert has.pairing_check == _mentions(code, "allowed_model_types")
    assert has.rollout_correlation == _mentions(code, '"ng-rollout"')
    # 0.4.0's collector already reads the tag; from 0.5.0 its servers give it.
    assert has.failure_class == _mentions(code, "_ng_failure_class", but="rollout_collection.py")
    assert has.mask_sample == _mentions(code, '"mask_sample"')
    assert has.worker_healthcheck == _mentions(code, '"uvicorn_timeout_worker_healthcheck"')
    assert has.environments_layout == any((root / "environments").glob("*/config.yaml"))
    providers = root / "nemo_gym" / "sandbox" / "providers"
    found = {p.name for p in providers.glob("*") if p.is_dir() and not p.name.startswith("_")}
    assert has.sandbox_providers == found
