"""Bad input through the env itself: a one-line error naming what and where, nothing started.

Each case goes the way a user's run goes (`load_environment`, iterate the taskset: what
prime-rl's orchestrator and vf-eval do before any env server or stack exists), and checks that
no stack was started: `NeMoGymStack.start` was never called (conftest's `launches` records every
call) and no process of this test session carries a stack's marker. What only a start can find
(a taken port, an interpreter that cannot build the runtime) fails every rollout with the reason
instead: an exception in `Env.start` would kill verifiers' env-server worker and hang its callers.
A release the package index does not have is tests/stack/test_bad_input.py.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest
from helpers.evals import error_text, model_context
from helpers.processes import Launches, launched_processes
from pydantic import ValidationError

import nemo_gym_env
from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.policies.scripted import ScriptedPolicy

ENV = "example_single_tool_call"
ROW = {"responses_create_params": {"input": [{"role": "user", "content": "hi"}]}}


@pytest.fixture
def load_fails(launches: Launches, session_tag: str):
    """`load_fails(Error, match, **fields)`: load the env and read its rows, expecting `Error`
    (a `ValidationError` when the config itself refuses); check that no stack started; return
    the error's one-line message."""

    def check(expected: type[Exception], match: str, **fields) -> str:
        with pytest.raises(expected, match=match) as info:
            env = nemo_gym_env.load_environment(**fields)
            list(env.taskset)
        assert launches.stacks == []  # refused before any NeMo Gym process was spawned
        assert launched_processes(session_tag) == []
        return _one_line(info.value)

    return check


def _one_line(error: Exception) -> str:
    message = error.errors()[0]["msg"] if isinstance(error, ValidationError) else str(error)
    assert message and "\n" not in message.strip(), message
    return message


@pytest.fixture
def start_fails(launches: Launches, session_tag: str, policy: ScriptedPolicy):
    """`await start_fails(match, **fields)`: the env loads and serves; every rollout is an
    error whose message matches; nothing started a stack or reached the model."""

    async def check(match: str, **fields) -> str:
        env = nemo_gym_env.load_environment(**fields)
        tasks = list(env.taskset)[:2]
        async with env.serving():
            episodes = [await env.run_episode(t, model_context(policy)) for t in tasks]
        assert launches.stacks == []
        assert launched_processes(session_tag) == []
        assert policy.calls == []
        for episode in episodes:
            assert not episode.ok
            assert episode.traces[0].rewards.get("nemo_gym") is None  # an error, no reward
            assert re.search(match, error_text(episode)), error_text(episode)
        return error_text(episodes[0])

    return check


def test_unknown_environment_suggests_close_matches(load_fails):
    message = load_fails(
        ValidationError, "example_single_tool_cal", nemo_env="example_single_tol_call"
    )
    assert message.startswith("Value error, env.taskset.nemo_env: unknown NeMo Gym environment")
    assert "Did you mean" in message


@pytest.mark.parametrize("form", [["a,b"], "a,b", ["a", "b"], ["a", " b,"]])
def test_comma_and_repeated_forms_select_each_environment(form):
    from verifiers_nemogym.taskset import NeMoGymTasksetConfig

    fields = NeMoGymTasksetConfig.model_fields
    assert fields["nemo_env"].is_required() is False
    # The validator alone (names are checked against the release in the model validator).
    assert NeMoGymTasksetConfig._split_names(form) == ["a", "b"]


def test_comma_and_list_forms_from_the_command_line_select_two_environments():
    """`--env.taskset.nemo-env a,b` and `--env.taskset.nemo-env a b`, as verifiers' CLI (and
    prime-rl's, the same config parser) read them. A repeated flag is not a third form: that
    parser keeps the last value of a repeated flag before any field validator sees it."""
    from pydantic_config import cli
    from verifiers.v1.cli.resolve import narrow_config
    from verifiers.v1.configs.cli.eval import EvalConfig

    base = ["--env.taskset.id", "nemo-gym-env", "-m", "m", "--env.taskset.nemo-env"]
    comma = [*base, "example_single_tool_call,example_multi_step"]
    spaced = [*base, "example_single_tool_call", "example_multi_step"]
    for argv in (comma, spaced):
        config = cli(narrow_config(EvalConfig, argv), args=argv)
        assert config.env.taskset.nemo_env == ["example_single_tool_call", "example_multi_step"]


def test_malformed_jsonl_line_names_file_and_line(load_fails, tmp_path: Path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(ROW) + "\n{oops\n")
    load_fails(ConfigError, f"{rows}:2:", jsonl_path=str(rows), nemo_env=ENV)


def test_row_without_responses_create_params(load_fails, tmp_path: Path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "hi"}\n')
    load_fails(
        ConfigError, "rows.jsonl:1: .*responses_create_params", jsonl_path=str(rows), nemo_env=ENV
    )


def test_missing_rows_file_is_refused_by_the_config(load_fails, tmp_path: Path):
    missing = tmp_path / "nope.jsonl"
    load_fails(ValidationError, f"jsonl_path: no such file: {missing}", jsonl_path=str(missing))


def test_agent_ref_no_environment_defines(load_fails, tmp_path: Path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({**ROW, "agent_ref": {"name": "ghost_agent"}}) + "\n")
    load_fails(ConfigError, "ghost_agent", jsonl_path=str(rows), nemo_env=ENV)


def test_rows_without_agent_ref_on_a_stack_of_several_agents(load_fails, tmp_path: Path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(ROW) + "\n")
    load_fails(
        ConfigError, "no agent_ref", jsonl_path=str(rows), nemo_env=f"{ENV},example_multi_step"
    )


def test_config_yaml_that_does_not_parse(load_fails, tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("my_server:\n  resources_servers: [unclosed\n")
    load_fails(
        ConfigError, f"{bad}:\\d+:\\d+: .*not valid YAML", nemo_env=ENV, config_paths=[str(bad)]
    )


def test_unusable_python_for_nemo_gym(load_fails, tmp_path: Path):
    missing = tmp_path / "python3.12"
    load_fails(
        ValidationError, f"env.taskset.python: .*{missing}", nemo_env=ENV, python=str(missing)
    )


async def test_proxy_port_in_use_fails_every_rollout_with_the_reason(start_fails):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        message = await start_fails(
            f"did not start: model proxy cannot listen on 127.0.0.1:{port}",
            nemo_env=ENV,
            proxy_port=port,
        )
    assert "proxy-port" in message


def test_nemo_gym_version_that_is_no_release_number(load_fails):
    load_fails(ValidationError, "not a nemo-gym release number", nemo_env=ENV,
               nemo_gym_version="../../etc")  # fmt: skip


def test_a_judge_environment_without_a_judge_is_refused_before_anything_starts(load_fails):
    message = load_fails(ConfigError, "grade", nemo_env="equivalence_llm_judge,simpleqa")
    assert message.startswith("equivalence_llm_judge, simpleqa grade(s) with an LLM judge")
    assert "--env.taskset.judge.base-url" in message


def test_optional_judges_stay_off_without_a_judge() -> None:
    env = nemo_gym_env.load_environment(nemo_env="math_with_judge")
    assert len(list(env.taskset)) > 0


def test_an_unset_key_variable_is_refused_by_name(load_fails, monkeypatch) -> None:
    monkeypatch.delenv("NO_SUCH_JUDGE_KEY", raising=False)
    judge = {"base_url": "http://127.0.0.1:1/v1", "model": "m", "api_key_var": "NO_SUCH_JUDGE_KEY"}
    message = load_fails(ConfigError, "NO_SUCH_JUDGE_KEY", nemo_env="simpleqa", judge=judge)
    assert "the judge's key variable $NO_SUCH_JUDGE_KEY is not set" in message


async def test_a_ray_address_nothing_answers_at_fails_every_rollout_in_one_line(start_fails):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connections are refused
        message = await start_fails(
            f"did not start: the Ray cluster at 127.0.0.1:{port} does not answer",
            nemo_env=ENV,
            ray_address=f"127.0.0.1:{port}",
        )
    assert "\n" not in message.strip(), message
