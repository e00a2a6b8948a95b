"""NeMo Gym 0.4.0 and 0.7.0 side by side: release choice, the Python floor opt-in, and the
catalog over both environment layouts. Configs that need NeMo Gym's own resolver (include/inherit,
merged by NeMo Gym itself) are tests/stack/nemo/test_catalog_releases.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from verifiers_nemogym.conformance.tables import NOT_OFFLINE, offline_status
from verifiers_nemogym.errors import ConfigError, VenvSetupError
from verifiers_nemogym.nemo import venv as venv_module
from verifiers_nemogym.nemo.catalog import ENVIRONMENTS, RESOURCES_SERVERS, Catalog
from verifiers_nemogym.nemo.release import RELEASES
from verifiers_nemogym.nemo.venv import (
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
    assert not any(venv_module._satisfies(v, RELEASES["0.7.0"].python_floor) for v in versions)
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


def test_07_moved_stub_names_its_new_name(catalog_07: Catalog) -> None:
    with pytest.raises(ConfigError, match="moved to 'hermes_reasoning_gym'"):
        catalog_07.env("reasoning_gym_hermes")
    entries = {e.name: e for e in catalog_07.entries()}
    assert entries["reasoning_gym_hermes"].problem == "moved to hermes_reasoning_gym"


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
    assert offline_status("mcqa", None, {}, "0.6.0")[1].endswith("(NeMo Gym 0.6.0)")
    # 0.5.1 verified a subset: what it did not run is not taken from another release's list.
    assert offline_status("mcqa", None, {}, "0.5.1")[0] is True
    assert offline_status("arc_agi", None, {}, "0.5.1")[0] is False
    # A release without a list of its own (a newer one) is judged by the newest older one's.
    assert offline_status("mcqa", None, {}, "0.9.0")[1].endswith("(NeMo Gym 0.7.0)")
    # Only what ran counts as running here: a clean-looking environment not run is a "no".
    assert offline_status("never_run_here", None, {}, "0.7.0") == (
        False,
        "not run here yet (its files show no judge, key, sandbox or URL requirement)",
    )
    # The coding-agent harnesses: the survey's measurement, or its reason, or "not run yet".
    assert offline_status("cline_math", None, entries["cline_math"].facts, "0.7.0")[1] == (
        "ran here (harness survey, NeMo Gym 0.7.0, 2026-11-26; needs cline_version=3.0.57 "
        "(3.0.55 is not on the npm registry))"
    )
    assert offline_status("hermes_math", None, entries["hermes_math"].facts, "0.7.0") == (
        False,
        "its agent is a Python package installed from GitHub",
    )
    assert offline_status("pi_math", None, entries["pi_math"].facts, "0.6.0") == (
        False,
        "a coding-agent CLI harness not run here yet",
    )
    # Container environments: their config defines no agent (the entry's problem); the
    # survey says they ran with NeMo Gym's pairing, or why not.
    pro = entries["swebench_pro"]
    assert pro.problem == "swebench_pro.yaml defines no agent server"
    ok, why = offline_status("swebench_pro", pro.problem, pro.facts, "0.7.0")
    assert ok and why.startswith(
        "ran here with --env.taskset.config-paths benchmarks/swebench/pro/opencode.yaml"
    ), why
    assert "needs a docker daemon" in why
    assert why.endswith(
        "; also ran through opensandbox (opensandbox-server 1.1.1 on this "
        "machine, docker runtime, the stand-in execd; unisolated, opted in)"
    ), why
    ok, why = offline_status("swerl_gen", None, entries["swerl_gen"].facts, "0.7.0")
    assert not ok and "singularity" in why
    judged = [e for e in entries.values() if "judge" in e.facts]
    assert judged, "no config shows a judge model"
    e = judged[0]
    assert offline_status(e.root.name, e.problem, e.facts) in {
        (False, "an LLM judge model server in its config"),
        (False, NOT_OFFLINE.get(e.root.name, "")),
    }
