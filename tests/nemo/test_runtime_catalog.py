"""The NeMo Gym runtime venv (found, created once, reused cheaply) and the catalog read from it."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from verifiers_nemogym.errors import ConfigError, VenvSetupError
from verifiers_nemogym.nemo.catalog import (
    AGENTS,
    ENVIRONMENT_SERVERS,
    Catalog,
    load_config,
    run_targets,
    server_blocks,
    write_policy_placeholder,
)
from verifiers_nemogym.nemo.venv import (
    DEFAULT_NEMO_GYM_VERSION,
    NeMoGymVenv,
    base_interpreter,
    ensure_venv,
    find_python_for,
)
from verifiers_nemogym.util import clean_env, find_uv


def find_python(spec: str | None = None) -> Path:
    return find_python_for(spec)[0]


def test_find_python_accepts_a_named_interpreter() -> None:
    found = find_python()
    assert find_python(str(found)) == found


def test_find_python_rejects_a_missing_interpreter(tmp_path: Path) -> None:
    with pytest.raises(VenvSetupError, match="does not exist"):
        find_python(str(tmp_path / "no-such-python"))


def test_find_python_rejects_an_old_interpreter(tmp_path: Path) -> None:
    # An interpreter that answers the version probe as CPython 3.11 does, whatever Python runs
    # the tests (the package supports 3.11-3.13 itself, so sys.executable may be new enough).
    old = tmp_path / "python3.11"
    old.write_text("#!/bin/sh\necho CPython 3.11.9\n")
    old.chmod(0o755)
    with pytest.raises(VenvSetupError, match=r"is 3\.11\.9; NeMo Gym needs CPython >= 3\.12"):
        find_python(str(old))


def test_find_python_env_var_is_honoured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VF_NEMOGYM_PYTHON", str(tmp_path / "missing"))
    with pytest.raises(VenvSetupError, match="missing"):
        find_python()


def test_ensure_runtime_is_reused_quickly(nemo_venv: NeMoGymVenv) -> None:
    started = time.perf_counter()
    again = ensure_venv(DEFAULT_NEMO_GYM_VERSION)
    assert time.perf_counter() - started < 0.5
    assert again == nemo_venv
    assert again.nemo_gym_version == DEFAULT_NEMO_GYM_VERSION
    assert again.bin("ng_run").exists()
    assert (again.site_packages / "nemo_gym").is_dir()
    # The same interpreter named explicitly hits the same cache entry.
    assert ensure_venv(python=str(again.python)) == again
    assert again.info == {
        "nemo_gym": DEFAULT_NEMO_GYM_VERSION,
        "python": again.python_version,
        "below_floor": False,
    }


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory, nemo_venv: NeMoGymVenv) -> Path:
    """`bin/python` of a virtual environment made from the runtime's interpreter: what prime-rl
    and `uv run` run the taskset and env servers from."""
    folder = tmp_path_factory.mktemp("user-venv") / "venv"
    subprocess.run(
        [str(find_uv()), "venv", "-q", "--python", str(nemo_venv.python), str(folder)],
        check=True,
        env=clean_env(),
    )
    return folder / "bin" / "python"


def test_a_venv_interpreter_is_traced_to_its_base(venv_python: Path, nemo_venv: NeMoGymVenv):
    base = base_interpreter(venv_python)
    assert base != venv_python and base.parent == nemo_venv.python.parent
    assert base_interpreter(nemo_venv.python) == nemo_venv.python
    # Named by the user, or found first on PATH, it yields the base interpreter.
    assert find_python(str(venv_python)) == base


def test_a_runtime_recorded_with_a_venv_interpreter_is_repaired(
    venv_python: Path, nemo_venv: NeMoGymVenv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A cache written by an earlier release under prime-rl recorded the venv's interpreter;
    NeMo Gym's per-server `uv venv --python X.Y.Z` then finds no interpreter on PATH. The
    runtime is repaired (its record rewritten), never reused as it was."""
    monkeypatch.setenv("VF_NEMOGYM_CACHE", str(tmp_path))
    runtime = tmp_path / "runtimes" / nemo_venv.venv.name
    runtime.mkdir(parents=True)
    (runtime / "bin").symlink_to(nemo_venv.venv / "bin")
    marker = json.loads((nemo_venv.venv / "vf-nemogym-runtime.json").read_text())
    (runtime / "vf-nemogym-runtime.json").write_text(
        json.dumps({**marker, "python": str(venv_python)})
    )
    found = ensure_venv(nemo_venv.nemo_gym_version, nemo_venv.python_version)
    assert found.venv == runtime
    assert found.python == base_interpreter(venv_python) != venv_python
    assert not (found.python.parent.parent / "pyvenv.cfg").exists()  # not inside a venv
    assert found.env()["PATH"].split(":")[0] == str(found.python.parent)  # no venv bin first
    on_disk = json.loads((runtime / "vf-nemogym-runtime.json").read_text())
    assert on_disk["python"] == str(found.python)


def test_runtime_env_puts_its_interpreter_first(nemo_venv: NeMoGymVenv) -> None:
    env = nemo_venv.env(Path("/tmp/vfng-x"))
    assert env["PATH"].split(":")[0] == str(nemo_venv.python.parent)
    assert env["UV_PYTHON_DOWNLOADS"] == "never"
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert env["RAY_TMPDIR"] == "/tmp/vfng-x"
    assert "VIRTUAL_ENV" not in env


def test_runtime_processes_write_bytecode_whatever_the_user_set(
    nemo_venv: NeMoGymVenv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NeMo Gym's processes compile the cache's venvs once, not at every stack start."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    code = "import sys; print(sys.dont_write_bytecode)"
    out = subprocess.run(
        [str(nemo_venv.venv / "bin" / "python"), "-c", code],
        env=nemo_venv.env(Path("/tmp/vfng-x")), capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "False"


def test_catalog_lists_packaged_environments(catalog: Catalog) -> None:
    names = catalog.names()
    assert "example_single_tool_call" in names
    assert len(names) > 50


def test_catalog_reads_configs_and_resolves_their_paths(catalog: Catalog, tmp_path: Path) -> None:
    relative = "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml"
    path = catalog.config_path(relative)
    assert path == catalog.root / relative and path.is_file()
    assert catalog.config_path(str(path)) == path
    blocks = server_blocks(load_config(path), AGENTS)
    assert {name: impl for name, (impl, _) in blocks.items()} == {
        "example_single_tool_call_simple_agent": "simple_agent"
    }
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match=f"^{listing}: a NeMo Gym config must be a YAML mapping"):
        load_config(listing)
    placeholder = load_config(write_policy_placeholder(tmp_path, "127.0.0.1", 4321))
    ((name, (impl, settings)),) = server_blocks(placeholder, "responses_api_models").items()
    assert (name, settings["host"], settings["port"]) == ("policy_model", "127.0.0.1", 4321)
    assert (tmp_path / "responses_api_models" / impl / "requirements.txt").is_file()


def test_catalog_env_and_dataset(catalog: Catalog) -> None:
    spec = catalog.env("example_single_tool_call")
    assert [p.name for p in spec.config_paths] == ["example_single_tool_call.yaml"]
    assert spec.agent.name == "example_single_tool_call_simple_agent"
    assert spec.agent.impl == "simple_agent"
    example = spec.dataset()
    assert example.is_file()
    row = json.loads(example.read_text().splitlines()[0])
    assert "responses_create_params" in row


def test_catalog_picks_the_config_of_an_env_without_a_same_named_yaml(catalog: Catalog) -> None:
    spec = catalog.env("equivalence_rule")
    assert [p.name for p in spec.config_paths] == ["lc.yaml"]
    assert spec.agent.name == "lc_equivalence_rule_simple_agent"
    assert spec.dataset().is_file()


def test_catalog_example_fallback_and_missing_train_data(catalog: Catalog) -> None:
    spec = catalog.env("reasoning_gym")
    # Its config lists only a train dataset, but the wheel ships data/example.jsonl.
    assert spec.dataset("example") == spec.root / "data" / "example.jsonl"
    with pytest.raises(ConfigError, match="ng_download_dataset_from_hf"):
        spec.dataset("train")


def test_catalog_unknown_env_lists_close_matches(catalog: Catalog) -> None:
    with pytest.raises(ConfigError, match="example_single_tool_call"):
        catalog.env("example_single_tool")


def test_catalog_unknown_config(catalog: Catalog) -> None:
    with pytest.raises(ConfigError, match=r"available: lc\.yaml"):
        catalog.env("equivalence_rule", config="nope")


def test_catalog_reports_unparsable_yaml(tmp_path: Path, nemo_venv: NeMoGymVenv) -> None:
    # A fake runtime layout, so the real site-packages stays untouched.
    site = tmp_path / "lib" / "python3.12" / "site-packages"
    configs = site / "resources_servers" / "broken" / "configs"
    configs.mkdir(parents=True)
    (configs / "broken.yaml").write_text("broken: [unclosed\n")
    fake = NeMoGymVenv(
        venv=tmp_path,
        python=nemo_venv.python,
        python_version="3.12.1",
        nemo_gym_version=nemo_venv.nemo_gym_version,
    )
    with pytest.raises(ConfigError, match=str(configs / "broken.yaml")):
        Catalog(fake).env("broken")


def _block(kind: str, impl: str, port: int | None, **settings: object) -> dict[str, object]:
    address = {"host": "127.0.0.1", "port": port} if port else {}
    return {kind: {impl: {"entrypoint": "app.py", **address, **settings}}}


def test_run_targets_send_each_agent_to_the_environment_server_fronting_it() -> None:
    """A merged config as NeMo Gym 0.7's head server returns it: a fronted agent's `/run` goes
    to its environment server; an unfronted one, or one whose front has no address, keeps its
    own; a front of an agent the stack does not run adds nothing; IPv6 hosts are bracketed."""

    def front(agent: str, port: int | None) -> dict[str, object]:
        ref = {"type": AGENTS, "name": agent}
        return _block(ENVIRONMENT_SERVERS, "legacy_agent", port, agent_server=ref)

    merged = {
        "fronted": _block(AGENTS, "simple_agent", 1001),
        "fronted_env": front("fronted", 2001),
        "alone": _block(AGENTS, "simple_agent", 1002),
        "unaddressed_front": _block(AGENTS, "simple_agent", 1003),
        "unaddressed_front_env": front("unaddressed_front", None),
        "stray_env": front("no_such_agent", 2004),
        "no_address": _block(AGENTS, "simple_agent", None),
        "v6": {AGENTS: {"simple_agent": {"entrypoint": "app.py", "host": "::1", "port": 1005}}},
        "head_server": {"host": "127.0.0.1", "port": 11000},
    }
    assert run_targets(merged) == {
        "fronted": "http://127.0.0.1:2001",
        "alone": "http://127.0.0.1:1002",
        "unaddressed_front": "http://127.0.0.1:1003",
        "v6": "http://[::1]:1005",
    }


def test_a_shared_stacks_key_follows_its_config_contents(nemo_venv: NeMoGymVenv, tmp_path: Path):
    """M2: editing a config (say, an agent setting) makes another stack, never an attach to the
    one still running the old file; the same files give the same key."""
    from verifiers_nemogym.shared.client import stack_key

    config = tmp_path / "extra.yaml"
    config.write_text("my_server:\n  resources_servers:\n    x:\n      entrypoint: app.py\n")
    first = stack_key(nemo_venv, [config])
    assert stack_key(nemo_venv, [config]) == first
    config.write_text("my_server:\n  resources_servers:\n    x:\n      entrypoint: main.py\n")
    assert stack_key(nemo_venv, [config]) != first
