"""Bad input through the env itself: a one-line error naming what and where, nothing started.

Each case goes the way a user's run goes (`load_environment`, iterate the taskset, `serving()`),
and checks that no proxy or stack is left behind.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

import nemo_gym_env
from verifiers_nemogym.errors import ConfigError, NeMoGymError, VenvSetupError

ENV = "example_single_tool_call"
ROW = {"responses_create_params": {"input": [{"role": "user", "content": "hi"}]}}


async def start_fails(expected: type[NeMoGymError], match: str, **fields) -> str:
    """Load the env, read its rows and serve it, expecting `expected`; return its first line."""
    env = nemo_gym_env.load_environment(**fields)
    with pytest.raises(expected, match=match) as info:
        list(env.taskset)
        async with env.serving():
            pass
    assert env._stack is None and env._lease is None and env._proxy is None  # nothing left
    message = str(info.value)
    assert message and "\n" not in message.strip(), message
    return message


async def test_unknown_environment_suggests_close_matches():
    message = await start_fails(
        ConfigError, "example_single_tool_cal", nemo_env="example_single_tol_call"
    )
    assert "Did you mean" in message


async def test_malformed_jsonl_line_names_file_and_line(tmp_path: Path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(ROW) + "\n{oops\n")
    await start_fails(ConfigError, f"{rows}:2:", jsonl_path=str(rows), nemo_env=ENV)


async def test_row_without_responses_create_params(tmp_path: Path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "hi"}\n')
    await start_fails(
        ConfigError, "rows.jsonl:1: .*responses_create_params", jsonl_path=str(rows), nemo_env=ENV
    )


async def test_agent_ref_the_stack_cannot_have(tmp_path: Path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({**ROW, "agent_ref": {"name": "ghost_agent"}}) + "\n")
    await start_fails(ConfigError, "ghost_agent", jsonl_path=str(rows), nemo_env=ENV)


async def test_rows_without_agent_ref_on_a_stack_of_several_agents(tmp_path: Path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(ROW) + "\n")
    await start_fails(
        ConfigError, "no agent_ref", jsonl_path=str(rows), nemo_env=f"{ENV},example_multi_step"
    )


async def test_config_yaml_that_does_not_parse(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("my_server:\n  resources_servers: [unclosed\n")
    await start_fails(
        ConfigError, f"{bad}:\\d+:\\d+: .*not valid YAML", nemo_env=ENV, config_paths=[str(bad)]
    )


async def test_proxy_port_in_use():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        await start_fails(ConfigError, f"127.0.0.1:{port}", nemo_env=ENV, proxy_port=port)


async def test_unusable_python_for_nemo_gym(tmp_path: Path):
    missing = tmp_path / "python3.12"
    await start_fails(VenvSetupError, str(missing), nemo_env=ENV, python=str(missing))


async def test_nemo_gym_version_that_cannot_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.setenv("VF_NEMOGYM_CACHE", str(tmp_path / "cache"))
    env = nemo_gym_env.load_environment(nemo_env=ENV, nemo_gym_version="0.0.0.dev999")
    with pytest.raises(VenvSetupError, match=re.escape("nemo-gym==0.0.0.dev999")) as info:
        list(env.taskset)
    assert info.value.args[0].splitlines()[0].startswith("installing nemo-gym==0.0.0.dev999 failed")
    runtimes = tmp_path / "cache" / "runtimes"
    assert not [p for p in runtimes.iterdir() if not p.name.startswith(".")]  # nothing half-made
