"""The catalog of NeMo Gym 0.7.0 where NeMo Gym's own config resolver merges include/inherit
configs (both environment layouts), and every environment of 0.4.0 resolving or saying why
not (`list --resolve`). Release choice, the Python floor opt-in and the plain configs of both
releases are tests/nemo/test_catalog_releases.py."""

from __future__ import annotations

import os
import time

import pytest
from helpers.evals import PROVIDERS_HEADING, ListSurvey, script
from helpers.processes import REPO, run_command

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.nemo.catalog import ENVIRONMENTS, RESOURCES_SERVERS, Catalog
from verifiers_nemogym.nemo.venv import NeMoGymVenv


@pytest.fixture(scope="module")
def catalog_07(nemo_venv_07: NeMoGymVenv) -> Catalog:
    return Catalog(nemo_venv_07)


# runs NeMo Gym's config resolver (~10-30 s per config, cached)
def test_07_resources_layout_with_include_and_inherit(catalog_07: Catalog) -> None:
    # configs/example_single_tool_call_single_agent_turn.yaml includes the single-agent-turn
    # environment server's config (`config_paths:`) and inherits from it (`_inherit_from:`).
    spec = catalog_07.env("example_single_tool_call", "example_single_tool_call_single_agent_turn")
    assert spec.layout == RESOURCES_SERVERS
    assert [a.name for a in spec.agents] == ["example_single_tool_call_session_agent"]
    assert spec.dataset().is_file()
    # The default config of the same folder is a plain file, read without the resolver.
    plain = catalog_07.env("example_single_tool_call")
    assert plain.agent.name == "example_single_tool_call_simple_agent"


# runs NeMo Gym's config resolver (~10-30 s per config, cached)
def test_07_resolver_is_cached(catalog_07: Catalog) -> None:
    config = catalog_07.config_path("resources_servers/aviary/configs/aviary.yaml")
    catalog_07.merged_config(config)  # first call may run `gym env resolve` (~10 s)
    started = time.perf_counter()
    merged = catalog_07.merged_config(config)
    assert time.perf_counter() - started < 1.0
    assert "config_paths" in merged


# runs NeMo Gym's config resolver (~10-30 s per config, cached)
def test_07_environments_layout(catalog_07: Catalog) -> None:
    # Only in environments/ (no resources server folder of that name).
    spec = catalog_07.env("calendar_v2")
    assert spec.layout == ENVIRONMENTS and spec.root.name == "calendar_v2"
    assert [p.name for p in spec.config_paths] == ["config.yaml"]
    assert spec.agent.name == "calendar_simple_agent"
    assert spec.dataset("example").is_file()
    with pytest.raises(ConfigError, match="ng_download_dataset_from_hf"):
        spec.dataset("train")
    # A manifest-backed entry whose config.yaml only includes the resources server's config.
    both = catalog_07.env("environments/example_single_tool_call")
    assert both.layout == ENVIRONMENTS
    assert both.agent.name == "example_single_tool_call_simple_agent"
    assert both.dataset().is_file()
    # The bare name keeps the resources server layout (as in 0.4.0).
    assert catalog_07.env("example_single_tool_call").layout == RESOURCES_SERVERS


# runs NeMo Gym's config resolver (~10-30 s per config, cached)
def test_07_dataset_declared_on_the_resources_server(catalog_07: Catalog) -> None:
    spec = catalog_07.env("example_session_state_mgmt", "example_session_state_mgmt_nooa")
    assert {d.type for d in spec.server_datasets} == {"example"}
    assert spec.dataset("example").is_file()


async def test_list_resolve_resolves_every_environment_or_says_why(
    nemo_venv: NeMoGymVenv,
) -> None:
    """`nemo-gym-env list --resolve` on 0.4.0 (the default release here): the survey of every
    environment, each resolved as a run resolves it or given a one-line reason, and the same
    as the committed report (docs/surveys/nemo-gym-0.4.0-environments.md; a few seconds, as no
    0.4.0 config needs NeMo Gym's resolver). 0.7.0's survey runs NeMo Gym's resolver over some
    50 include/inherit configs (a minute or more when cold), so it is a committed report only:
    docs/surveys/nemo-gym-0.7.0-environments.md."""
    code, printed = await run_command(
        [script("nemo-gym-env"), "--nemo-gym-version", nemo_venv.nemo_gym_version, "list",
         "--resolve"],
        dict(os.environ),
    )  # fmt: skip
    assert code == 0, printed[-3000:]
    survey = ListSurvey.read(printed)
    assert survey.total == (95, 12)
    assert survey.resolvable[0] >= 94 and survey.resolvable[1] >= 12
    for row in survey.unresolved:  # one line saying why, not running here
        assert row[4] == "no" and row[5].removesuffix(" |").strip(), row
    committed = (REPO / "docs/surveys/nemo-gym-0.4.0-environments.md").read_text()
    # From the count line on (the line above names this machine's Python).
    table = printed[printed.index("resolvable: ") :].split(PROVIDERS_HEADING)[0].strip()
    assert committed.rstrip().endswith(table), "the survey changed: rerun it into the report"
