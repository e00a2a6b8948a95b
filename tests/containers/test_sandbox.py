"""What merged configs ask of sandboxes, and the config a stack adds (containers/sandbox.py).

Configs are NeMo Gym 0.7.0's own shapes: the docker provider config binds `sandbox`, servers
reference it with `sandbox_provider: sandbox`."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.sandboxes import DOCKER, SERVERS

from verifiers_nemogym.containers import sandbox
from verifiers_nemogym.containers.docker import DockerHost, check_isolation
from verifiers_nemogym.containers.sandbox import (
    CONTAINER_POLICY_INSTANCE,
    GUARDED_VERIFY,
    NG_KEEPALIVE,
    SANDBOX_PACKAGES_OPTION,
    Bounds,
    check_sandbox_packages,
    docker_creates,
    row_image,
    sandbox_plan,
    shadow_servers,
    stack_config,
)
from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.nemo.venv import NeMoGymVenv


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
    assert create["extra_run_args"] == ["--init", "--label", "vf-nemogym.stack=m1", "--rm"]
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


INLINE = {
    "inline": {"responses_api_agents": {"opencode_sandboxed_agent": {
        "entrypoint": "app.py",
        "sandbox_provider": {"docker": {"create": {"extra_run_args": ["--init"],
                                                   "network": "bridge"},
                                        "exec": {"concurrency": 4}}},
        "resources_server": {"type": "resources_servers", "name": "tb"},
        "model_server": {"type": "responses_api_models", "name": "policy_model"}}}},
    "anyterm": {"responses_api_agents": {"anyterminal_agent": {"entrypoint": "app.py"}}},
}  # fmt: skip


def test_every_way_of_naming_docker_gets_the_network_labels_and_bounds(tmp_path: Path) -> None:
    """A block reference, an inline `{docker: {...}}` and an agent's default provider (NeMo
    Gym 0.7.0's anyterminal_agent: `{"docker": {}}`) all end up with the stack's network,
    labels and bounds once the stack's config is merged after the user's."""
    plan = sandbox_plan([SERVERS, DOCKER, INLINE])
    assert plan is not None
    assert {s.instance: s.block for s in plan.servers if s.block is None} == {
        "inline": None,
        "anyterm": None,
    }
    config = stack_config(
        plan, label="vf-nemogym.stack=m1", network="vfng-m1", door=("172.30.0.1", 4567),
        workdir=tmp_path, labels=("vf-nemogym.boot=b",),
    )  # fmt: skip
    creates = docker_creates(plan, config)
    assert set(creates) == {"swepro", "agent", "tb", "tb_agent", "inline", "anyterm"}
    for instance, create in creates.items():
        assert create["network"] == "vfng-m1", instance
        args = create["extra_run_args"]
        assert args[-5:] == ["--label", "vf-nemogym.stack=m1", "--label", "vf-nemogym.boot=b",
                             "--rm"], instance  # fmt: skip
        assert create["pids_limit"] == 1024
        assert "NET_RAW" in create["cap_drop"] and "no-new-privileges" in create["security_opt"]
        assert create["keepalive_cmd"] == "sleep 3600"
    inline = config["inline"]["responses_api_agents"]["opencode_sandboxed_agent"]
    # The inline provider's own settings stay; its agent still reaches the door.
    assert inline["sandbox_provider"]["docker"]["exec"] == {"concurrency": 4}
    assert inline["model_server"]["name"] == CONTAINER_POLICY_INSTANCE


def test_a_provider_config_loosens_each_bound(tmp_path: Path) -> None:
    loose = {"sandbox": {"docker": {"create": {
        "pids_limit": 100000, "cap_drop": [], "security_opt": ["no-new-privileges:false"],
        "keepalive_cmd": "sleep 86400"}}}}  # fmt: skip
    plan = sandbox_plan([SERVERS, loose])
    assert plan is not None
    config = stack_config(
        plan, label="l=1", network="n", door=None, workdir=tmp_path, bounds=Bounds(lifetime_s=60)
    )
    create = config["sandbox"]["docker"]["create"]
    assert create["pids_limit"] == 100000 and create["cap_drop"] == []
    assert create["security_opt"] == ["no-new-privileges:false"]
    assert create["keepalive_cmd"] == "sleep 86400"
    # NeMo Gym's own endless keepalive is not a user's choice: the lifetime replaces it.
    endless = {"sandbox": {"docker": {"create": {"keepalive_cmd": NG_KEEPALIVE}}}}
    plan = sandbox_plan([SERVERS, endless])
    assert plan is not None
    config = stack_config(
        plan, label="l=1", network="n", door=None, workdir=tmp_path, bounds=Bounds(lifetime_s=60)
    )
    assert config["sandbox"]["docker"]["create"]["keepalive_cmd"] == "sleep 60"


def test_nemo_gyms_sandbox_ttl_is_capped_at_the_lifetime_unless_the_keepalive_is_the_users(
    tmp_path: Path,
) -> None:
    """NeMo Gym's docker provider runs `sleep <ttl_s>` instead of `keepalive_cmd` when a
    server's `sandbox_config.ttl_s` is set (its shipped swebench_pro and terminal_bench_2_1
    configs say 18000): the stack caps a longer one at the lifetime, keeps a shorter one, and
    leaves it alone where the provider's `create` sets its own keepalive."""
    shipped = {
        "swepro": {"resources_servers": {"swebench_pro": {"sandbox_config": {
            "ttl_s": 18000, "resources": {"cpu": 1}}}}},
        "tb": {"resources_servers": {"terminal_bench_2_1": {"sandbox_config": {"ttl_s": 60}}}},
    }  # fmt: skip
    plan = sandbox_plan([SERVERS, DOCKER, shipped])
    assert plan is not None
    config = stack_config(plan, label="l=1", network="n", door=None, workdir=tmp_path)
    merged = sandbox.merge_configs([plan.merged, config])
    where = (("swepro", "resources_servers", "swebench_pro"),
             ("tb", "resources_servers", "terminal_bench_2_1"),
             ("agent", "responses_api_agents", "opencode_sandboxed_agent"))  # fmt: skip
    ttl = {i: merged[i][t][m].get("sandbox_config", {}).get("ttl_s") for i, t, m in where}
    assert ttl == {"swepro": 3600, "tb": 60, "agent": None}, ttl
    assert merged["swepro"]["resources_servers"]["swebench_pro"]["sandbox_config"]["resources"]
    own = {"sandbox": {"docker": {"create": {"keepalive_cmd": "sleep 86400"}}}}
    plan = sandbox_plan([SERVERS, DOCKER, shipped, own])
    assert plan is not None
    config = stack_config(plan, label="l=1", network="n", door=None, workdir=tmp_path)
    assert "sandbox_config" not in config.get("swepro", {}).get("resources_servers", {}).get(
        "swebench_pro", {}
    ), config


REFUSE = """
import logging, sys
sys.path.insert(0, {tests!r})
from helpers.sandboxes import DOCKER, SERVERS
from verifiers_nemogym.containers.docker import DockerHost, check_isolation
from verifiers_nemogym.containers.sandbox import sandbox_plan
from verifiers_nemogym.errors import ConfigError
logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
plan = sandbox_plan([SERVERS, DOCKER])
try:
    check_isolation(plan, DockerHost(cpus=1, memory_bytes=0), allow=False)
except ConfigError as e:
    print("REFUSED", e)
check_isolation(plan, DockerHost(cpus=1, memory_bytes=0), allow=True)
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)
def test_isolation_fails_closed_for_a_second_uid_and_the_opt_in_says_what_is_exposed() -> None:
    """Run as uid 65534 (a real second uid: no iptables rules for it), the docker containers
    of a plan cannot be firewalled: refused in one line naming root and the option; with the
    option, one warning saying what they reach."""
    code = REFUSE.format(tests=str(Path(__file__).parent.parent))
    # Read-search on files only (CAP_DAC_READ_SEARCH), so a checkout in a folder of mode 0700
    # (a `mktemp -d` clone) imports too; the uid, the check's subject, stays 65534.
    read_anywhere = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    run = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *read_anywhere,
         sys.executable, "-c", code],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if "ModuleNotFoundError" in run.stderr:  # the package or the tests' helpers
        pytest.fail(
            f"uid 65534 cannot import from {Path(__file__).parents[2]} even with "
            "CAP_DAC_READ_SEARCH"
        )
    assert run.returncode == 0, run.stderr[-3000:]
    refused, warned = run.stdout.splitlines()
    assert refused.startswith("REFUSED cannot isolate the sandbox containers: missing root")
    assert "--env.taskset.allow-unisolated-containers true" in refused
    assert "run UNISOLATED (opted in" in warned and "reach every service this host" in warned


def test_isolation_fails_closed_without_iptables_rootless_remote_or_another_provider(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each thing the package needs to isolate containers, missing, is named; a provider it has
    no isolation for (NeMo Gym's opensandbox here) is refused the same way; an isolated docker
    plan passes."""
    plan = sandbox_plan([SERVERS, DOCKER])
    assert plan is not None
    host = DockerHost(cpus=1, memory_bytes=0)
    if os.geteuid() == 0 and shutil.which("iptables"):
        assert check_isolation(plan, host, allow=False) == []
    monkeypatch.setenv("PATH", str(tmp_path))  # no iptables on it
    monkeypatch.setenv("DOCKER_HOST", "tcp://192.0.2.1:2376")
    with pytest.raises(ConfigError) as caught:
        check_isolation(plan, replace(host, rootless=True), allow=False)
    text = str(caught.value)
    assert "\n" not in text
    for missing in ("iptables (not on PATH", "a rootful docker daemon", "a local docker daemon"):
        assert missing in text, text
    monkeypatch.undo()
    other = sandbox_plan([SERVERS, {"sandbox": {"opensandbox": {"connection": {}}}}])
    assert other is not None
    with pytest.raises(ConfigError, match="'opensandbox' sandbox provider's containers"):
        check_isolation(other, None, allow=False)
    assert len(check_isolation(other, None, allow=True, log=None)) == 1


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


MOUNTINFO = """\
27 1 0:25 / / rw,relatime - overlay overlay rw,lowerdir=/l
40 27 7:0 / /var/lib/docker rw,relatime - xfs /dev/loop0 rw,attr2,inode64,prjquota
41 27 7:1 / /srv rw,relatime - xfs /dev/loop1 rw,attr2,inode64,noquota
42 41 7:2 / /srv/docker-ext rw,relatime - ext4 /dev/loop2 rw
"""


def test_the_disk_quota_is_read_from_the_mount_holding_dockers_data_root() -> None:
    """overlay2 bounds a container's writable layer only on xfs with project quotas: the mount
    whose point is the longest prefix of docker's data root decides."""
    from verifiers_nemogym.containers.docker import disk_quota_at

    assert disk_quota_at("/var/lib/docker", MOUNTINFO)
    assert disk_quota_at("/var/lib/docker/overlay2", MOUNTINFO)
    assert not disk_quota_at("/var/lib/dockerx", MOUNTINFO)  # on the root overlay
    assert not disk_quota_at("/srv/docker", MOUNTINFO)  # xfs without quotas
    assert not disk_quota_at("/srv/docker-ext/docker", MOUNTINFO)  # ext4 inside xfs


def test_a_disk_bound_becomes_a_storage_opt_unless_the_user_set_one() -> None:
    """Where the daemon can keep a disk bound (`Bounds.disk`, set by the stack on xfs with
    project quotas), each container gets `--storage-opt size=`; a user's own is kept."""
    create = sandbox.docker_create({}, ["l=1"], None, Bounds(disk="64m"))
    args = create["extra_run_args"]
    assert args[args.index("--storage-opt") + 1] == "size=64m" and args[-1] == "--rm", args
    assert "--storage-opt" not in sandbox.docker_create({}, [], None, Bounds())["extra_run_args"]
    own = {"create": {"extra_run_args": ["--storage-opt", "size=1g"]}}
    args = sandbox.docker_create(own, [], None, Bounds(disk="64m"))["extra_run_args"]
    assert args.count("--storage-opt") == 1 and "size=1g" in args, args


def test_firewalled_containers_get_apt_without_retries_read_only(tmp_path: Path) -> None:
    """With `apt_conf` (a firewalled stack), every docker container binds that file read-only
    at `APT_NO_RETRIES`; a folder holding a comma stays one CSV field (docker parses `--mount`
    as CSV); without it, no mount."""
    conf = tmp_path / "a,b" / "apt-no-retries.conf"
    args = sandbox.docker_create({}, ["l=1"], "n", Bounds(), "10.0.0.1", conf)["extra_run_args"]
    (fields,) = csv.reader([args[args.index("--mount") + 1]])
    assert fields == [
        "type=bind",
        f"source={conf}",
        f"target={sandbox.APT_NO_RETRIES}",
        "readonly",
    ], fields
    assert args[-1] == "--rm", args
    assert "--mount" not in sandbox.docker_create({}, [], "n", Bounds())["extra_run_args"]
    assert 'Acquire::Retries "0";' in sandbox.APT_NO_RETRIES_TEXT


# ------------------------------------------------------------------ sandbox_packages


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("", "is not one requirement line"),
        ("my-provider\n--index-url https://elsewhere", "is not one requirement line"),
        ("--extra-index-url https://elsewhere/simple", "is a pip option"),
        ("-e ./somewhere", "is a pip option"),
        ("my-provider @ https://user:s3cret@example.org/p.whl", "a URL with credentials"),
        ("git+https://tok@example.org/p.git", "a URL with credentials"),
        ("./missing-0.1-py3-none-any.whl", "no wheel, sdist or package folder"),
        ("/nonexistent/folder/", "no wheel, sdist or package folder"),
        ("my provider!", "is neither a requirement"),
    ],
)
def test_a_bad_sandbox_package_is_one_line_naming_the_option(line: str, says: str) -> None:
    with pytest.raises(ConfigError) as raised:
        check_sandbox_packages([line])
    message = str(raised.value)
    assert message.startswith(SANDBOX_PACKAGES_OPTION) and says in message, message
    assert "\n" not in message
    assert "s3cret" not in message and "tok@" not in message  # the credential is not repeated


def test_sandbox_packages_keep_requirements_and_make_local_paths_absolute(
    tmp_path: Path,
) -> None:
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "p-0.1-py3-none-any.whl").write_bytes(b"wheel")
    lines = ["my-provider==1.2", "./plugin", "p-0.1-py3-none-any.whl", "q @ https://h/q.whl"]
    assert check_sandbox_packages(lines, base=tmp_path) == [
        "my-provider==1.2",
        str(tmp_path / "plugin"),
        str(tmp_path / "p-0.1-py3-none-any.whl"),
        "q @ https://h/q.whl",
    ]
    # A folder that is no package is refused like a missing one.
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no wheel, sdist or package folder"):
        check_sandbox_packages([str(tmp_path / "empty")])


def test_every_sandbox_server_gets_the_sandbox_packages_in_its_requirements(
    tmp_path: Path,
) -> None:
    """A plug-in provider's package reaches the venv of each server that starts sandboxes
    (whichever provider, docker's included), after the server's own requirements; the
    installed requirements are untouched."""
    installed, workdir = tmp_path / "site-packages", tmp_path / "stack"
    agent = installed / "responses_api_agents" / "opencode_sandboxed_agent"
    agent.mkdir(parents=True)
    (agent / "requirements.txt").write_text("-e nemo-gym[dev,sandbox] @ ../../\n")
    plugin = {"sandbox": {"fake_plugin": {}}}
    for name, provider in (("plugin", plugin), ("docker", DOCKER)):
        plan = sandbox_plan([{"agent": SERVERS["agent"]}, provider])
        assert plan is not None
        packages = ["/wheels/my_provider-0.1-py3-none-any.whl", "other==2"]
        shadowed = shadow_servers(plan, installed, workdir / name, "0.7.0", packages)
        assert shadowed == ["responses_api_agents/opencode_sandboxed_agent"], name
        shadow = workdir / name / "responses_api_agents" / "opencode_sandboxed_agent"
        assert (shadow / "requirements.txt").read_text().splitlines() == [
            "-e nemo-gym[dev,sandbox] @ ../../",
            *packages,
        ]
    assert (agent / "requirements.txt").read_text() == "-e nemo-gym[dev,sandbox] @ ../../\n"
    # Without packages a plug-in's server keeps NeMo Gym's folder (nothing to add).
    plan = sandbox_plan([{"agent": SERVERS["agent"]}, plugin])
    assert plan is not None
    assert shadow_servers(plan, installed, workdir / "none", "0.7.0") == []


def test_sandbox_packages_get_server_venvs_of_their_own(tmp_path: Path) -> None:
    """NeMo Gym puts a server's venv at `<uv_venv_dir>/<type>/<name>` whatever it installs:
    a stack with sandbox packages uses a folder named by them and by a local wheel's bytes."""
    runtime = NeMoGymVenv(tmp_path / "rt", tmp_path / "python", "3.13.0", "0.7.0")
    wheel = tmp_path / "p-0.1-py3-none-any.whl"
    wheel.write_bytes(b"one")
    assert runtime.server_venvs_for([]) == runtime.server_venvs_dir
    first = runtime.server_venvs_for([str(wheel)])
    assert first.parent == runtime.server_venvs_dir.parent
    assert first.name.startswith(f"{runtime.server_venvs_dir.name}+sandbox-")
    assert runtime.server_venvs_for([str(wheel)]) == first  # stable
    wheel.write_bytes(b"two")  # rebuilt at the same path
    assert runtime.server_venvs_for([str(wheel)]) not in (first, runtime.server_venvs_dir)
    assert runtime.server_venvs_for(["other==1"]) != runtime.server_venvs_for(["other==2"])
