"""What merged configs ask of sandboxes, and the config a stack adds (containers/sandbox.py).

Configs are NeMo Gym 0.7.0's own shapes: the docker provider config binds `sandbox`, servers
reference it with `sandbox_provider: sandbox`."""

from __future__ import annotations

from pathlib import Path

import pytest

from verifiers_nemogym.containers import sandbox
from verifiers_nemogym.containers.sandbox import (
    CONTAINER_POLICY_INSTANCE,
    GUARDED_VERIFY,
    row_image,
    sandbox_plan,
    shadow_servers,
    stack_config,
)
from verifiers_nemogym.errors import ConfigError

DOCKER = {
    "sandbox": {
        "default_metadata": {"sandbox-api": "docker-cli"},
        "docker": {"create": {"use_init": True, "extra_run_args": ["--init"]}},
    }
}
SERVERS = {
    "swepro": {"resources_servers": {"swebench_pro": {
        "entrypoint": "app.py", "image_repository": "local/swetask",
        "sandbox_provider": "sandbox",
        "sandbox_config": {"resources": {"cpu": 4, "memory_mib": 2048}}}}},
    "agent": {"responses_api_agents": {"opencode_sandboxed_agent": {
        "entrypoint": "app.py", "sandbox_provider": "sandbox", "artifacts_dir": None,
        "resources_server": {"type": "resources_servers", "name": "swepro"},
        "model_server": {"type": "responses_api_models", "name": "policy_model"}}}},
    "tb": {"resources_servers": {"terminal_bench_2_1": {
        "entrypoint": "app.py", "sandbox_provider": "sandbox"}}},
    "tb_agent": {"responses_api_agents": {"opencode_sandboxed_agent": {
        "entrypoint": "app.py", "sandbox_provider": "sandbox",
        "resources_server": {"type": "resources_servers", "name": "tb"},
        "model_server": {"type": "responses_api_models", "name": "policy_model"}}}},
    "plain": {"responses_api_agents": {"simple_agent": {"entrypoint": "app.py"}}},
}  # fmt: skip


def test_no_sandboxed_server_is_no_plan() -> None:
    assert sandbox_plan([{"plain": SERVERS["plain"]}]) is None


def test_the_plan_names_servers_providers_and_the_agents_calling_the_model() -> None:
    plan = sandbox_plan([SERVERS, DOCKER])
    assert plan is not None
    assert {s.instance for s in plan.servers} == {"swepro", "agent", "tb", "tb_agent"}
    assert set(plan.providers) == {"docker"} and plan.blocks == {"sandbox": "docker"}
    assert [a.instance for a in plan.model_agents] == ["agent", "tb_agent"]
    swepro = next(s for s in plan.servers if s.instance == "swepro")
    assert swepro.request("cpu") == 4 and swepro.request("memory_mib") == 2048
    assert swepro.request("disk_gib") is None


def test_a_provider_no_config_defines_is_one_line_naming_the_server() -> None:
    with pytest.raises(ConfigError) as caught:
        sandbox_plan([SERVERS])
    text = str(caught.value)
    assert "\n" not in text
    assert "sandbox_provider 'sandbox' is defined by no config" in text
    assert "nemo_gym/sandbox/providers/docker/configs/docker.yaml" in text


def test_a_block_with_two_providers_is_refused() -> None:
    two = {"sandbox": {"docker": {}, "local": {}}}
    with pytest.raises(ConfigError, match="must name exactly one provider"):
        sandbox_plan([SERVERS, two])


def test_row_images_as_nemo_gym_computes_them() -> None:
    plan = sandbox_plan([SERVERS, DOCKER])
    assert plan is not None
    row = {"dockerhub_tag": "tinycalc-0001", "image_digest": ""}
    assert row_image(row, "agent", plan.merged) == "local/swetask:tinycalc-0001"
    digest = {"dockerhub_tag": "x", "image_digest": "sha256:ab"}
    assert row_image(digest, "agent", plan.merged) == "local/swetask@sha256:ab"
    assert row_image({"docker_image": "local/tb:one"}, "tb_agent", plan.merged) == "local/tb:one"
    assert row_image({"docker_image": "x"}, "plain", plan.merged) is None
    assert row_image({}, "nobody", plan.merged) is None


def test_the_stack_config_labels_isolates_and_routes_through_the_door(tmp_path: Path) -> None:
    plan = sandbox_plan([SERVERS, DOCKER])
    assert plan is not None
    config = stack_config(
        plan, label="vf-nemogym.stack=m1", network="vfng-m1", door=("172.30.0.1", 4567),
        workdir=tmp_path,
    )  # fmt: skip
    create = config["sandbox"]["docker"]["create"]
    assert create["network"] == "vfng-m1"
    # The user's own run arguments stay, ours follow; the provider's other settings stay.
    assert create["extra_run_args"] == ["--init", "--label", "vf-nemogym.stack=m1"]
    assert create["use_init"] is True
    assert config["observability_enabled"] is True
    agent = config["agent"]["responses_api_agents"]["opencode_sandboxed_agent"]
    assert agent["model_server"] == {
        "type": "responses_api_models",
        "name": CONTAINER_POLICY_INSTANCE,
    }
    assert agent["artifacts_dir"] == str(tmp_path / "artifacts" / "agent")
    tb_agent = config["tb_agent"]["responses_api_agents"]["opencode_sandboxed_agent"]
    assert "artifacts_dir" not in tb_agent
    door = config[CONTAINER_POLICY_INSTANCE]["responses_api_models"]["vf_external_model"]
    assert (door["host"], door["port"]) == ("172.30.0.1", 4567)


def test_without_a_door_agents_keep_their_model_server(tmp_path: Path) -> None:
    other = {"sandbox": {"opensandbox": {"connection": {}}}}
    plan = sandbox_plan([SERVERS, other])
    assert plan is not None and plan.docker is None
    config = stack_config(plan, label=None, network=None, door=None, workdir=tmp_path)
    assert "sandbox" not in config and CONTAINER_POLICY_INSTANCE not in config
    assert "model_server" not in config["agent"]["responses_api_agents"]["opencode_sandboxed_agent"]


def test_servers_writing_in_their_folder_write_in_the_stacks_folder(tmp_path: Path) -> None:
    installed, workdir = tmp_path / "site-packages", tmp_path / "stack"
    pro = installed / "resources_servers" / "swebench_pro"
    (pro / "logs").mkdir(parents=True)
    (pro / "app.py").write_text("app")
    (installed / "resources_servers" / "swebench").mkdir()
    plan = sandbox_plan([SERVERS, DOCKER])
    assert plan is not None
    assert shadow_servers(plan, installed, workdir, "0.7.0") == ["resources_servers/swebench_pro"]
    shadow = workdir / "resources_servers" / "swebench_pro"
    assert (shadow / "app.py").is_symlink() and (shadow / "app.py").read_text() == "app"
    assert (shadow / "logs").is_dir() and not (shadow / "logs").is_symlink()
    assert (workdir / "resources_servers" / "swebench").resolve() == (
        installed / "resources_servers" / "swebench"
    )
    # terminal_bench_2_1 writes nothing in its folder: no shadow (and none without its files).
    assert not (workdir / "resources_servers" / "terminal_bench_2_1").exists()


def test_servers_of_a_provider_package_get_its_client_in_their_venv(tmp_path: Path) -> None:
    """NeMo Gym drops a server's `-e nemo-gym[dev,sandbox] @ ../..` requirement when installed
    from a wheel: the stack's copy of the requirements asks for the sandbox extra instead."""
    installed, workdir = tmp_path / "site-packages", tmp_path / "stack"
    agent = installed / "responses_api_agents" / "opencode_sandboxed_agent"
    agent.mkdir(parents=True)
    (agent / "requirements.txt").write_text("-e nemo-gym[dev,sandbox] @ ../../\n")
    (agent / "app.py").write_text("app")
    remote = {"sandbox": {"opensandbox": {"connection": {}}}}
    plan = sandbox_plan([{"agent": SERVERS["agent"]}, remote])
    assert plan is not None
    shadowed = shadow_servers(plan, installed, workdir, "0.7.0")
    assert shadowed == ["responses_api_agents/opencode_sandboxed_agent"]
    shadow = workdir / "responses_api_agents" / "opencode_sandboxed_agent"
    assert (shadow / "requirements.txt").read_text().splitlines() == [
        "-e nemo-gym[dev,sandbox] @ ../../",
        "nemo-gym[sandbox]==0.7.0",
    ]
    assert not (shadow / "requirements.txt").is_symlink() and (shadow / "app.py").is_symlink()
    # The docker provider needs no client package: nothing to shadow for the agent.
    docker_plan = sandbox_plan([{"agent": SERVERS["agent"]}, DOCKER])
    assert docker_plan is not None
    assert shadow_servers(docker_plan, installed, tmp_path / "other", "0.7.0") == []


def test_terminal_bench_on_docker_runs_the_verify_guard_as_its_app(tmp_path: Path) -> None:
    """terminal_bench_2_1 grades in the agent's container: on docker its `app.py` in the
    stack's folder is a copy of the guard (NeMo Gym's server whose `/verify` first ends the
    rollout's leftover processes), its other entries links; on another provider it keeps NeMo
    Gym's own `app.py`."""
    installed = tmp_path / "site-packages"
    tb = installed / "resources_servers" / "terminal_bench_2_1"
    tb.mkdir(parents=True)
    (tb / "app.py").write_text("nemo gym's app")
    (tb / "requirements.txt").write_text("-e nemo-gym[dev,sandbox] @ ../..\n")
    servers = {"tb": SERVERS["tb"]}
    plan = sandbox_plan([servers, DOCKER])
    assert plan is not None
    workdir = tmp_path / "stack"
    assert shadow_servers(plan, installed, workdir, "0.7.0") == [
        "resources_servers/terminal_bench_2_1"
    ]
    app = workdir / "resources_servers" / "terminal_bench_2_1" / "app.py"
    guard = Path(sandbox.__file__).with_name(GUARDED_VERIFY["terminal_bench_2_1"])
    assert not app.is_symlink() and app.read_text() == guard.read_text()
    assert "class GuardedTerminalBench21ResourcesServer(TerminalBench21ResourcesServer)" in (
        app.read_text()
    )
    assert (app.parent / "requirements.txt").is_symlink()
    remote = sandbox_plan([servers, {"sandbox": {"opensandbox": {"connection": {}}}}])
    assert remote is not None
    shadow_servers(remote, installed, tmp_path / "remote", "0.7.0")
    kept = tmp_path / "remote" / "resources_servers" / "terminal_bench_2_1" / "app.py"
    assert kept.is_symlink() and kept.read_text() == "nemo gym's app"
