"""NeMo Gym 0.7's coding-agent harness configs read as `nemo.agent_clis` reads them (the release's
own files, no runtime): which agents run a CLI, at what version, and how their calls are routed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verifiers_nemogym.nemo import agent_clis
from verifiers_nemogym.nemo.catalog import load_config
from verifiers_nemogym.nemo.release import release_files
from verifiers_nemogym.nemo.resolver import resolver_error

HARNESS_ENVS = {
    "opencode_math": ("opencode_agent", "1.17.11", True),
    "codex_math": ("codex_agent", "0.144.4", True),
    "claude_code_math": ("claude_code_agent", "latest", False),
}


@pytest.fixture(scope="module")
def release_07() -> Path:
    return release_files("0.7.0").root


@pytest.mark.parametrize("env", sorted(HARNESS_ENVS))
def test_harness_agents_of_the_shipped_configs(release_07: Path, env: str) -> None:
    config = load_config(release_07 / "environments" / env / "config.yaml")
    (agent,) = agent_clis.harness_agents([config])
    agent_type, version, direct = HARNESS_ENVS[env]
    assert (agent.instance, agent.cli.agent_type) == (f"{env}_agent", agent_type)
    assert (agent.version, agent.direct) == (version, direct)
    # The CLI NeMo Gym's own setup script installs is the one the table names.
    setup = next((release_07 / "responses_api_agents" / agent_type).glob("setup_*.py"))
    assert f'"{agent.cli.package}"' in setup.read_text()
    assert f'shutil.which("{agent.cli.command}")' in setup.read_text()


def test_every_cli_of_the_table_is_a_shipped_agent(release_07: Path) -> None:
    for agent_type, cli in agent_clis.CLIS.items():
        app = (release_07 / "responses_api_agents" / agent_type / "app.py").read_text()
        assert cli.version_field in app, agent_type


def test_a_later_config_overrides_the_cli_version_and_classic_agents_are_no_harness(
    release_07: Path,
) -> None:
    shipped = load_config(release_07 / "environments" / "codex_math" / "config.yaml")
    override = {
        "codex_math_agent": {"responses_api_agents": {"codex_agent": {"codex_version": "9.9.9"}}}
    }
    classic = load_config(
        release_07 / "resources_servers" / "example_single_tool_call" / "configs"
        / "example_single_tool_call.yaml"
    )  # fmt: skip
    (agent,) = agent_clis.harness_agents([shipped, override, classic])
    assert agent.version == "9.9.9"
    assert shipped["codex_math_agent"]["responses_api_agents"]["codex_agent"]["codex_version"] == (
        "0.144.4"
    )  # merging copies, never edits a config


def test_harness_config_routes_every_cli_through_policy_model_with_correlation(
    release_07: Path, tmp_path: Path
) -> None:
    configs = [
        load_config(release_07 / "environments" / env / "config.yaml") for env in HARNESS_ENVS
    ]
    agents = agent_clis.harness_agents(configs)
    config = agent_clis.harness_config(agents, tmp_path / "captures")
    assert config["observability_enabled"] is True  # agents then prefix the rollout id
    assert config["model_call_capture_dir"] == str(tmp_path / "captures")
    policy = {"type": "responses_api_models", "name": "policy_model"}
    # Direct agents get the model server NeMo Gym accepts for them; claude_code has one.
    assert config["opencode_math_agent"]["responses_api_agents"]["opencode_agent"] == {
        "model_server": policy
    }
    assert config["codex_math_agent"]["responses_api_agents"]["codex_agent"] == {
        "model_server": policy
    }
    assert "claude_code_math_agent" not in config
    assert agent_clis.harness_config([], tmp_path) == {}


def test_policy_keys_are_nemo_gyms_names_with_a_per_stack_key() -> None:
    first, second = agent_clis.policy_keys("http://127.0.0.1:1/v1"), agent_clis.policy_keys("u")
    assert set(first) == {"policy_base_url", "policy_api_key", "policy_model_name"}
    assert first["policy_base_url"] == "http://127.0.0.1:1/v1"
    assert first["policy_api_key"] != second["policy_api_key"]


def test_cli_env_keeps_each_cli_from_updating_itself() -> None:
    env = agent_clis.cli_env()
    assert env["CLINE_NO_AUTO_UPDATE"] == "1" and env["DISABLE_AUTOUPDATER"] == "1"


@pytest.mark.parametrize(
    ("engines", "need"),
    [({"node": ">=22.19.0"}, (22, 19, 0)), ({"node": "^20"}, (20,)), ({}, None)],
)
def test_node_requirement_of_a_cli(tmp_path: Path, engines: dict, need) -> None:
    manifest = tmp_path / "package.json"
    manifest.write_text(json.dumps({"name": "x", "engines": engines}))
    assert agent_clis._node_requirement(manifest) == need
    assert agent_clis._node_satisfies((22, 19, 1), (22, 19, 0))
    assert not agent_clis._node_satisfies((20, 20, 2), (22, 19, 0))
    assert not agent_clis._node_satisfies((), (20,))


def test_resolver_error_is_nemo_gyms_reason_in_one_line() -> None:
    # What `gym env resolve` (NeMo Gym 0.7.0) printed for a config reading an unset key.
    printed = (
        "Error: Config value 'cline_math_agent.responses_api_agents.cline_agent.model' \n"
        "references 'some_missing_key', which is not set after merging.\n\n"
        "Provide it via a CLI override, in env.yaml, or in a config you pass via \n"
        "config_paths.\nFor example, on the command line:\n  ++some_missing_key=<value>\n"
    )
    assert resolver_error(printed, 1) == (
        "Config value 'cline_math_agent.responses_api_agents.cline_agent.model' references "
        "'some_missing_key', which is not set after merging."
    )
    assert resolver_error("a\nlast line\n", 1) == "last line"
    assert resolver_error("", 2) == "exit 2"


def test_npm_error_is_the_line_that_says_what_went_wrong() -> None:
    printed = (  # npm 11's output for a version the registry does not have
        "npm error code ETARGET\n"
        "npm error notarget No matching version found for cline@0.0.1.\n"
        "npm error notarget In most cases you or one of your dependencies are requesting\n"
        "npm error A complete log of this run can be found in: /x/_logs/debug-0.log\n"
    )
    assert agent_clis.npm_error(printed) == "notarget No matching version found for cline@0.0.1."
    assert agent_clis.npm_error("") == "no output"


def test_resolver_error_names_the_almost_server_and_why() -> None:
    """What `gym env resolve` (NeMo Gym 0.7.0) printed for environments/nemo_user_sim: the
    validation error on stderr between rule lines, the `Error:` line on stdout followed at once
    by the config it dumps. The reason says which server failed and why, and no rule line."""
    rule = "═" * 51
    stderr = (
        f"{rule}\nConfiguration Warnings: Almost-Servers Detected\n{rule}\n\n"
        "    Almost-Server Detected: 'policy_model'\n"
        "    This server configuration failed validation:\n\n"
        "  - function-after -> responses_api_models: Dictionary should have at most 1 \n"
        "item after validation, not more\n\n"
        "    This server will NOT be started.\n    \n"
        f"{rule}\n\n"
    )
    stdout = (
        "Error: Found 1 almost-server(s) with validation errors. Fix the issues above or \n"
        "set error_on_almost_servers=false to bypass this error.\n"
        "Found global config dict yaml:\nenvironment_server_routes:\n  a: b\n"
    )
    assert resolver_error(stderr + "\n" + stdout, 1) == (
        "Found 1 almost-server(s) with validation errors. Fix the issues above or set "
        "error_on_almost_servers=false to bypass this error. (policy_model: function-after -> "
        "responses_api_models: Dictionary should have at most 1 item after validation, not more)"
    )
    assert resolver_error(f"{rule}\nsome reason\n{rule}\n", 1) == "some reason"
