"""`ray_address`: the option's one-line refusals, the stack identity it takes part in, and the
environment NeMo Gym's processes get to join a cluster (the token as a file, never a value).
A stack joining a real cluster is tests/stack/test_ray_cluster.py."""

from __future__ import annotations

import json
import socket
import stat
import subprocess
from pathlib import Path

import pytest
from helpers.stacks import PLACEHOLDER_CONFIG, unstarted_stack
from pydantic import ValidationError

from verifiers_nemogym.cli import main
from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.ray_cluster import (
    LOOPBACK_ONLY_VAR,
    TOKEN_FILE,
    RayCluster,
    parse_ray_address,
)
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.shared.client import host_spec, stack_key
from verifiers_nemogym.shared.protocol import HostSpec, host_secrets
from verifiers_nemogym.taskset import NeMoGymTasksetConfig

TOKEN = "ab" * 32


@pytest.mark.parametrize(
    ("given", "address"),
    [("127.0.0.1:6379", "127.0.0.1:6379"), (" head-0:6379 ", "head-0:6379"),
     ("[::1]:6379", "[::1]:6379")],
)  # fmt: skip
def test_a_ray_address_is_host_and_gcs_port(given: str, address: str) -> None:
    assert NeMoGymTasksetConfig(ray_address=given).ray_address == address


@pytest.mark.parametrize(
    ("given", "says"),
    [("ray://head:10001", "a URL is not a Ray cluster address"),
     ("http://head:8265", "a URL is not a Ray cluster address"),
     ("head", "is not host:port"), ("head:0", "is not host:port"),
     ("head:70000", "is not host:port"), ("a b:1", "is not host:port"),
     ("::1:6379", "write an IPv6 address as [host]:port")],
)  # fmt: skip
def test_a_bad_ray_address_is_one_line_naming_it(given: str, says: str) -> None:
    with pytest.raises(ValidationError) as info:
        NeMoGymTasksetConfig(ray_address=given)
    message = info.value.errors()[0]["msg"]
    assert says in message and repr(given) in message and "\n" not in message


def test_ray_address_is_for_stacks_started_here() -> None:
    with pytest.raises(ValidationError, match="runs on the Ray its starter gave it"):
        NeMoGymTasksetConfig(ray_address="127.0.0.1:6379", stack_url="http://127.0.0.1:1")


def test_the_ray_cluster_is_part_of_a_shared_stacks_identity(
    nemo_venv: NeMoGymVenv, catalog: Catalog
) -> None:
    paths = catalog.env("example_single_tool_call").config_paths
    private = stack_key(nemo_venv, paths)
    a = stack_key(nemo_venv, paths, ray=RayCluster("127.0.0.1:6379"))
    b = stack_key(nemo_venv, paths, ray=RayCluster("127.0.0.1:6380"))
    assert len({private, a, b}) == 3
    assert private == stack_key(nemo_venv, paths, None, None)  # existing stacks keep their key
    # The credential is not the cluster: the same address is the same stack.
    assert a == stack_key(nemo_venv, paths, ray=RayCluster("127.0.0.1:6379", token=TOKEN))


def test_a_token_given_by_value_reaches_processes_only_as_a_private_file(tmp_path: Path) -> None:
    cluster = RayCluster.from_environ("10.0.0.5:6379", {"RAY_AUTH_TOKEN": TOKEN})
    base = {"RAY_AUTH_TOKEN": "stale", LOOPBACK_ONLY_VAR: "0", "PATH": "/bin"}
    env = cluster.env(base, tmp_path)
    path = tmp_path / TOKEN_FILE
    assert env["RAY_AUTH_TOKEN_PATH"] == str(path) and env["RAY_AUTH_MODE"] == "token"
    assert path.read_text() == TOKEN and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert TOKEN not in json.dumps(env) and "RAY_AUTH_TOKEN" not in env
    # A remote address: Ray finds this node's address as the cluster sees it.
    assert LOOPBACK_ONLY_VAR not in env
    # The stack host's spec (its command line) never holds it; its stdin does.
    spec = HostSpec.from_json(
        host_spec(
            NeMoGymVenv(tmp_path, tmp_path, "3.12.1", "0.4.0"), [], None, 1, ray=cluster
        ).to_json()
    )
    assert TOKEN not in spec.to_json()
    assert spec.ray_with(host_secrets(None, cluster)) == cluster
    assert spec.ray_with(host_secrets(None, cluster)).token == TOKEN  # type: ignore[union-attr]
    assert repr(cluster).count(TOKEN) == 0


def test_a_token_file_is_handed_on_and_a_loopback_cluster_stays_loopback(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    cluster = RayCluster.from_environ("127.0.0.1:6379", {"RAY_AUTH_TOKEN_PATH": str(token)})
    env = cluster.env({LOOPBACK_ONLY_VAR: "0"}, tmp_path)
    assert env["RAY_AUTH_TOKEN_PATH"] == str(token) and env["RAY_AUTH_MODE"] == "token"
    assert env[LOOPBACK_ONLY_VAR] == "0"  # Ray would otherwise rewrite 127.0.0.1
    assert not (tmp_path / TOKEN_FILE).exists()
    with pytest.raises(ConfigError, match="no readable token file") as info:
        RayCluster.from_environ("127.0.0.1:6379", {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "no")})
    assert "\n" not in str(info.value)


def test_parse_ray_address_is_the_configs_check() -> None:
    with pytest.raises(ConfigError, match="is not host:port"):
        parse_ray_address("6379")


@pytest.mark.parametrize("release", ["0.4.0", "0.7.0"])
def test_nemo_gym_gets_the_address_in_its_own_key(
    release: str, nemo_venv: NeMoGymVenv, nemo_venv_07: NeMoGymVenv
) -> None:
    venv = nemo_venv if release == "0.4.0" else nemo_venv_07
    configs = Catalog(venv).env("example_single_tool_call").config_paths
    stack = unstarted_stack(venv, configs)
    private = stack.command([PLACEHOLDER_CONFIG], 11000, warm=True, deadline=1e12)
    assert not any("ray_head_node_address" in a for a in private)  # NeMo Gym starts its own
    stack.ray = RayCluster("[::1]:6379")
    joined = stack.command([PLACEHOLDER_CONFIG], 11000, warm=True, deadline=1e12)
    assert "+ray_head_node_address='[::1]:6379'" in joined  # quoted: one hydra string
    # The key the release itself reads (its `initialize_ray` passes it to `ray.init`).
    out = subprocess.run(
        [str(venv.bin("python")), "-c",
         "from nemo_gym.global_config import RAY_HEAD_NODE_ADDRESS_KEY_NAME as k; print(k)"],
        capture_output=True, text=True, timeout=120, env=venv.env(),
    )  # fmt: skip
    assert out.stdout.strip() == "ray_head_node_address", out.stderr[-2000:]


def test_stack_up_at_an_address_nothing_answers_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connections are refused
        code = main(
            ["stack", "up", "example_single_tool_call", "--ray-address", f"127.0.0.1:{port}"]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2  # the CLI's status for an error it names
    assert err[-1] == (
        f"nemo-gym-env: the Ray cluster at 127.0.0.1:{port} does not answer (connection refused)"
    )
