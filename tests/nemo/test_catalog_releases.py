"""NeMo Gym 0.4.0 and 0.7.0 side by side: release choice, the Python floor opt-in, and the
catalog over both environment layouts (include/inherit configs merged by NeMo Gym itself)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from verifiers_nemogym.conformance import NOT_OFFLINE, offline_status
from verifiers_nemogym.errors import ConfigError, NeMoGymError, VenvSetupError
from verifiers_nemogym.nemo import venv as venv_module
from verifiers_nemogym.nemo.catalog import ENVIRONMENTS, RESOURCES_SERVERS, Catalog
from verifiers_nemogym.nemo.venv import (
    KNOWN_RELEASES,
    NeMoGymVenv,
    default_version,
    ensure_venv,
    interpreters_available,
    python_floor,
)

PY_3130 = Path.home() / ".pyenv" / "versions" / "3.13.0" / "bin" / "python3"


@pytest.fixture(scope="module")
def catalog_07(nemo_venv_07: NeMoGymVenv) -> Catalog:
    return Catalog(nemo_venv_07)


@pytest.fixture(scope="module")
def catalog_04(nemo_venv: NeMoGymVenv) -> Catalog:
    return Catalog(nemo_venv)


def test_default_release_is_the_newest_whose_floor_an_interpreter_meets() -> None:
    versions = interpreters_available()
    assert versions, "no CPython found at all"
    # Here no interpreter reaches 3.13.14, so 0.5-0.7 are out and 0.4.0 is the default.
    assert not any(venv_module._satisfies(v, KNOWN_RELEASES["0.7.0"]) for v in versions)
    assert default_version() == "0.4.0"
    assert ensure_venv().nemo_gym_version == "0.4.0"


def test_default_release_follows_a_named_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    # A 3.13.14 interpreter (faked by its probe) makes 0.7.0 the default.
    monkeypatch.setattr(venv_module, "_probe_python", lambda exe: "3.13.14")
    assert default_version(str(PY_3130)) == "0.7.0"
    monkeypatch.setattr(venv_module, "_probe_python", lambda exe: "3.12.1")
    assert default_version(str(PY_3130)) == "0.4.0"


def test_floor_read_from_metadata_and_table(nemo_venv_07: NeMoGymVenv, nemo_venv) -> None:
    assert python_floor("0.7.0", nemo_venv_07.venv) == (3, 13, 14)
    assert python_floor("0.4.0", nemo_venv.venv) == (3, 12)
    assert python_floor("0.6.0") == (3, 13, 14)  # the table, nothing installed
    assert python_floor("0.7.5") == (3, 13, 14)  # unknown: the newest older known release


def test_below_floor_is_an_error_without_the_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VF_NEMOGYM_ALLOW_PYTHON_BELOW_FLOOR", raising=False)
    with pytest.raises(VenvSetupError) as info:
        ensure_venv("0.7.0", str(PY_3130))
    message = str(info.value)
    assert "\n" not in message
    assert "declares Python >= 3.13.14" in message and "3.13.0" in message
    assert "--env.taskset.allow-python-below-floor" in message
    assert "VF_NEMOGYM_ALLOW_PYTHON_BELOW_FLOOR=1" in message
    assert "--allow-python-below-floor" in message


def test_below_floor_opt_in_builds_a_marked_runtime(
    nemo_venv_07: NeMoGymVenv, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = nemo_venv_07
    assert runtime.below_floor and runtime.python_version == "3.13.0"
    assert runtime.venv.name == "nemo-gym-0.7.0-py3.13.0-below-floor"
    assert runtime.server_venvs_dir.name.endswith("-below-floor")
    assert runtime.info == {"nemo_gym": "0.7.0", "python": "3.13.0", "below_floor": True}
    marker = json.loads((runtime.venv / "vf-nemogym-runtime.json").read_text())
    assert marker["below_floor"] is True
    env = runtime.env(Path("/tmp/vfng-x"))
    assert Path(env["UV_CONFIG_FILE"]).read_text() == '[pip]\npython-version = "3.13.14"\n'
    assert (runtime.site_packages / "nemo_gym-0.7.0.dist-info").is_dir()
    # The environment variable is the same opt-in, and the cached runtime is reused at once.
    monkeypatch.setenv("VF_NEMOGYM_ALLOW_PYTHON_BELOW_FLOOR", "1")
    started = time.perf_counter()
    assert ensure_venv("0.7.0") == runtime
    assert time.perf_counter() - started < 0.5
    # A runtime that meets its floor never carries the override.
    assert "UV_CONFIG_FILE" not in ensure_venv("0.4.0").env()


@pytest.mark.stack  # runs NeMo Gym's config resolver (~10-30 s per config, cached)
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


@pytest.mark.stack  # runs NeMo Gym's config resolver (~10-30 s per config, cached)
def test_07_resolver_is_cached(catalog_07: Catalog) -> None:
    config = catalog_07.config_path("resources_servers/aviary/configs/aviary.yaml")
    catalog_07.merged_config(config)  # first call may run `gym env resolve` (~10 s)
    started = time.perf_counter()
    merged = catalog_07.merged_config(config)
    assert time.perf_counter() - started < 1.0
    assert "config_paths" in merged


@pytest.mark.stack  # runs NeMo Gym's config resolver (~10-30 s per config, cached)
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


def test_07_moved_stub_names_its_new_name(catalog_07: Catalog) -> None:
    with pytest.raises(ConfigError, match="moved to 'hermes_reasoning_gym'"):
        catalog_07.env("reasoning_gym_hermes")
    entries = {e.name: e for e in catalog_07.entries()}
    assert entries["reasoning_gym_hermes"].problem == "moved to hermes_reasoning_gym"


@pytest.mark.stack  # runs NeMo Gym's config resolver (~10-30 s per config, cached)
def test_07_dataset_declared_on_the_resources_server(catalog_07: Catalog) -> None:
    spec = catalog_07.env("example_session_state_mgmt", "example_session_state_mgmt_nooa")
    assert {d.type for d in spec.server_datasets} == {"example"}
    assert spec.dataset("example").is_file()


def test_04_catalog_lists_its_environments_layout_too(catalog_04: Catalog) -> None:
    entries = catalog_04.entries()
    layouts = {e.layout for e in entries}
    assert layouts == {RESOURCES_SERVERS, ENVIRONMENTS}
    spec = catalog_04.env("example_single_tool_call")
    assert spec.layout == RESOURCES_SERVERS


def test_list_offline_status_uses_conformance_data(catalog_07: Catalog) -> None:
    entries = {e.name: e for e in catalog_07.entries()}
    assert offline_status("mcqa", None, entries["mcqa"].facts)[0] is True
    ok, why = offline_status("wordle", None, {})
    assert not ok and "word list" in why
    # Each release has its own verified list; an environments/-only name is found by its folder.
    assert offline_status("calendar_v2", None, {}, "0.7.0") == (
        True,
        "verified by conformance runs (NeMo Gym 0.7.0)",
    )
    assert offline_status("mcqa", None, {}, "0.6.0")[1].endswith("(NeMo Gym 0.4.0)")
    judged = [e for e in entries.values() if "judge" in e.facts]
    assert judged, "no config shows a judge model"
    e = judged[0]
    assert offline_status(e.root.name, e.problem, e.facts) in {
        (False, "an LLM judge model server in its config"),
        (False, NOT_OFFLINE.get(e.root.name, "")),
    }


@pytest.mark.stack  # NeMo Gym's resolver over every include/inherit config (minutes when cold)
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
