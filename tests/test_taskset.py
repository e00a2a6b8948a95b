"""NeMoGymTaskset: rows from packaged data and JSONL files, and the errors bad input gets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.taskset import NeMoGymTaskset, NeMoGymTasksetConfig, parse_row

ROW = {"responses_create_params": {"input": [{"role": "user", "content": "weather in sf?"}]}}


def taskset(**fields) -> NeMoGymTaskset:
    return NeMoGymTaskset(NeMoGymTasksetConfig(id="nemo-gym-env", **fields))


def test_packaged_rows_load_untouched(nemo_venv):
    ts = taskset(nemo_env=["example_single_tool_call"])
    tasks = list(ts)
    source = nemo_venv.site_packages / "resources_servers/example_single_tool_call/data"
    rows = [json.loads(line) for line in (source / "example.jsonl").read_text().splitlines()]
    assert [t.data.row for t in tasks] == rows
    assert {t.data.agent for t in tasks} == {"example_single_tool_call_simple_agent"}
    assert tasks[0].data.name == "example_single_tool_call/example:1"
    assert tasks[0].data.prompt_text  # a prompt for display
    assert len({t.key for t in tasks}) == len(tasks)


def test_nemo_env_accepts_a_comma_list():
    config = NeMoGymTasksetConfig(id="nemo-gym-env", nemo_env="a, b")
    assert config.nemo_env == ["a", "b"]


def test_unknown_env_lists_close_matches(nemo_venv):
    with pytest.raises(ConfigError, match="example_single_tool_call"):
        list(taskset(nemo_env=["example_single_tool_cal"]))


def test_no_rows_configured_is_an_error():
    with pytest.raises(ConfigError, match="nemo-env"):
        taskset()


def test_jsonl_rows_keep_their_agent_ref(tmp_path: Path, nemo_venv):
    path = tmp_path / "rows.jsonl"
    ref = {"type": "responses_api_agents", "name": "my_agent"}
    path.write_text(json.dumps({**ROW, "agent_ref": ref}) + "\n\n" + json.dumps(ROW) + "\n")
    tasks = list(taskset(jsonl_path=path, agent="fallback_agent"))
    assert [t.data.agent for t in tasks] == ["my_agent", "fallback_agent"]
    assert [t.data.source for t in tasks] == [f"{path}:1", f"{path}:3"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"input": "hi"}', "no `responses_create_params`"),
        ('{"responses_create_params": {"tools": []}}', "input` must be"),
        ('{"responses_create_params": {"input": "hi"}, "agent_ref": "x"}', "agent_ref"),
    ],
)
def test_bad_rows_name_file_and_line(line: str, message: str):
    with pytest.raises(ConfigError, match=message) as info:
        parse_row(line, "rows.jsonl:7", None)
    assert str(info.value).startswith("rows.jsonl:7: ")


def test_malformed_line_in_file_names_its_line(tmp_path: Path, nemo_venv):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + '{"responses_create_params": \n')
    with pytest.raises(ConfigError, match=f"{path}:2: not valid JSON"):
        list(taskset(jsonl_path=path, agent="a"))


def test_missing_and_empty_files(tmp_path: Path, nemo_venv):
    with pytest.raises(ConfigError, match="not found"):
        list(taskset(jsonl_path=tmp_path / "nope.jsonl", agent="a"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        list(taskset(jsonl_path=tmp_path / "empty.jsonl", agent="a"))


def test_dataset_not_on_disk_says_how_to_get_it(nemo_venv):
    with pytest.raises(ConfigError, match="train"):
        list(taskset(nemo_env=["example_single_tool_call"], dataset="train"))


def test_jsonl_rows_bring_their_agents_environment(tmp_path: Path, nemo_venv):
    ref = {"type": "responses_api_agents", "name": "example_multi_step_simple_agent"}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({**ROW, "agent_ref": ref}) + "\n")
    configs = taskset(jsonl_path=path).config_paths()
    assert [p.name for p in configs] == ["example_multi_step.yaml"]
    path.write_text(json.dumps({**ROW, "agent_ref": {**ref, "name": "no_such_agent"}}) + "\n")
    with pytest.raises(ConfigError, match="no_such_agent"):
        taskset(jsonl_path=path).config_paths()
