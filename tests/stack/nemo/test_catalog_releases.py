"""The catalog of NeMo Gym 0.7.0 where NeMo Gym's own config resolver merges include/inherit
configs (both environment layouts), and every environment of 0.4.0 and 0.7.0 resolving or
saying why not. Release choice, the Python floor opt-in and the plain configs of both releases
are tests/nemo/test_catalog_releases.py."""

from __future__ import annotations

import time

import pytest

from verifiers_nemogym.errors import ConfigError, NeMoGymError
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


# NeMo Gym's resolver over every include/inherit config (minutes when cold)
@pytest.mark.parametrize("release", ["0.4.0", "0.7.0"])
def test_every_environment_resolves_or_has_a_reason(
    release: str, nemo_venv: NeMoGymVenv, nemo_venv_07: NeMoGymVenv
) -> None:
    catalog = Catalog(nemo_venv if release == "0.4.0" else nemo_venv_07)
    resolved: dict[str, int] = {RESOURCES_SERVERS: 0, ENVIRONMENTS: 0}
    reasons: dict[str, str] = {}
    for entry in catalog.entries():
        try:
            spec = catalog.env(entry.name)
        except NeMoGymError as e:
            reasons[entry.name] = str(e)
            continue
        assert spec.agents
        resolved[spec.layout] += 1
    for name, reason in reasons.items():
        assert reason and "\n" not in reason, name
    print(f"NeMo Gym {release}: resolvable {resolved}, with a reason {len(reasons)}: {reasons}")
    minimum = {"0.4.0": (94, 12), "0.7.0": (128, 46)}[release]
    assert resolved[RESOURCES_SERVERS] >= minimum[0]
    assert resolved[ENVIRONMENTS] >= minimum[1]
