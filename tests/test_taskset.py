"""NeMoGymTaskset: rows from packaged data and JSONL files, and the errors bad input gets."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.taskset import NeMoGymData, NeMoGymTaskset, NeMoGymTasksetConfig, parse_row

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
    config = NeMoGymTasksetConfig(
        id="nemo-gym-env", nemo_env="example_single_tool_call, example_multi_step"
    )
    assert config.nemo_env == ["example_single_tool_call", "example_multi_step"]


def test_unknown_env_lists_close_matches():
    with pytest.raises(ValidationError, match="example_single_tool_call"):
        taskset(nemo_env=["example_single_tool_cal"])


def test_no_rows_configured_is_an_error():
    with pytest.raises(ConfigError, match="nemo-env"):
        taskset()


def test_jsonl_rows_keep_their_agent_ref(tmp_path: Path, nemo_venv):
    path = tmp_path / "rows.jsonl"
    ref = {"type": "responses_api_agents", "name": "example_multi_step_simple_agent"}
    path.write_text(json.dumps({**ROW, "agent_ref": ref}) + "\n\n" + json.dumps(ROW) + "\n")
    fallback = "example_single_tool_call_simple_agent"
    tasks = list(taskset(jsonl_path=path, agent=fallback))
    assert [t.data.agent for t in tasks] == ["example_multi_step_simple_agent", fallback]
    assert [t.data.source for t in tasks] == [f"{path}:1", f"{path}:3"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"input": "hi"}', "no `responses_create_params`"),
        ('{"responses_create_params": {"tools": []}}', "input` must be"),
        ('{"responses_create_params": {"input": "hi"}, "agent_ref": "x"}', "agent_ref"),
        ('{"responses_create_params": {"input": "hi", "metadata": "x"}}', "metadata` must be"),
        ('{"responses_create_params": {"input": "hi", "metadata": {"k": 1}}}', "of strings"),
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


def test_a_line_that_is_not_utf8_names_its_line(tmp_path: Path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(json.dumps(ROW).encode() + b"\n" + b'{"x": "\xff"}\n')
    with pytest.raises(ConfigError, match=f"^{path}:2: not UTF-8"):
        list(taskset(jsonl_path=path, agent="example_single_tool_call_simple_agent"))


def test_sandbox_packages_take_a_line_or_a_list_and_refuse_bad_ones_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    (tmp_path / "p-0.1-py3-none-any.whl").write_bytes(b"wheel")
    monkeypatch.chdir(tmp_path)  # a relative path is the cwd's, made absolute
    wheel = str(tmp_path / "p-0.1-py3-none-any.whl")
    one = NeMoGymTasksetConfig(id="nemo-gym-env", sandbox_packages="./p-0.1-py3-none-any.whl")
    assert one.sandbox_packages == [wheel]
    listed = NeMoGymTasksetConfig(
        id="nemo-gym-env", sandbox_packages='["my-provider==1.2", "p-0.1-py3-none-any.whl"]'
    )
    assert listed.sandbox_packages == ["my-provider==1.2", wheel]
    assert NeMoGymTasksetConfig(id="nemo-gym-env").sandbox_packages == []
    for bad, says in (
        ("./gone.whl", "no wheel, sdist or package folder"),
        ('["--index-url https://elsewhere"]', "is a pip option"),
        ("[not json", "not a JSON list"),
    ):
        with pytest.raises(ValidationError) as raised:
            NeMoGymTasksetConfig(id="nemo-gym-env", sandbox_packages=bad)
        (error,) = raised.value.errors()
        assert "sandbox_packages" in error["msg"] and says in error["msg"], error["msg"]
        assert "\n" not in error["msg"]
    with pytest.raises(ValidationError, match="sandbox-packages is for stacks this machine"):
        NeMoGymTasksetConfig(
            id="nemo-gym-env", sandbox_packages="my-provider", stack_url="http://127.0.0.1:9"
        )


def test_missing_and_empty_files(tmp_path: Path, nemo_venv):
    with pytest.raises(ValidationError, match="no such file"):
        taskset(jsonl_path=tmp_path / "nope.jsonl", agent="a")
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


@pytest.fixture
def spawned() -> Iterator[list[list[str]]]:
    """Every command this process starts while the fixture is active (an audit hook: it sees
    `subprocess` and `os.exec*`/`posix_spawn` whatever library starts them)."""
    seen: list[list[str]] = []
    active = [True]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if active[0] and event in ("subprocess.Popen", "os.posix_spawn", "os.exec"):
            argv = args[1]  # (executable or path, argv, ...) for all three
            seen.append([str(a) for a in argv] if isinstance(argv, list | tuple) else [str(argv)])

    sys.addaudithook(hook)  # cannot be removed: it goes quiet instead
    yield seen
    active[0] = False


def test_load_on_an_empty_cache_builds_no_runtime_and_starts_no_nemo_gym_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawned: list[list[str]]
):
    """What prime-rl's orchestrator does with the taskset (resolve the config, list the rows)
    reads the release's files: no runtime venv, no server venv, no NeMo Gym command; the only
    commands are interpreter probes (which release fits this machine) and uv fetching the
    release's wheel without dependencies."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("VF_NEMOGYM_CACHE", str(cache))
    tasks = list(taskset(nemo_env="example_single_tool_call,example_multi_step"))
    assert len(tasks) == 10 and all(t.data.agent for t in tasks)
    assert sorted(p.name for p in cache.iterdir()) == ["releases"]  # no runtimes, no venvs
    for argv in spawned:
        probe = len(argv) == 3 and argv[1] == "-c" and "python_version" in argv[2]
        fetch = argv[1:4] == ["pip", "install", "--quiet"] and "--no-deps" in argv
        assert probe or fetch, argv
    assert any("--target" in argv for argv in spawned)  # the fetch happened, into the cache
    spawned.clear()
    assert len(list(taskset(nemo_env="example_single_tool_call"))) == 5
    assert [a for a in spawned if "pip" in a] == []  # cached: nothing fetched again


def test_rows_survive_the_json_round_trip_prime_rl_makes(nemo_venv):
    """prime-rl ships `task.data.model_dump(mode="json")` to an env server, which rebuilds the
    task there: the data must come back equal, row untouched."""
    for task in taskset(nemo_env="example_single_tool_call,example_multi_step"):
        wire = json.loads(json.dumps(task.data.model_dump(mode="json")))
        again = NeMoGymData.model_validate(wire)
        assert again == task.data
        assert again.row == task.data.row and again.agent == task.data.agent


def test_several_environments_load_in_turn_so_n_takes_rows_of_each(nemo_venv):
    """The first row of each environment, then the second of each...; verifiers' `-n N` takes
    the first N tasks, so `-n 3` with two environments runs rows of both."""
    from verifiers.v1.configs.select import SelectConfig

    names = ["example_single_tool_call", "example_multi_step"]
    alone = {n: [t.data.name for t in taskset(nemo_env=[n])] for n in names}
    both = [t.data.name for t in taskset(nemo_env=names)]
    assert both[:4] == [alone[names[0]][0], alone[names[1]][0], alone[names[0]][1],
                        alone[names[1]][1]]  # fmt: skip
    assert sorted(both) == sorted(alone[names[0]] + alone[names[1]])  # nothing lost or doubled
    for n in names:  # each environment keeps its own order
        assert [x for x in both if x.startswith(f"{n}/")] == alone[n]
    taken = [t.data.name for t in taskset(nemo_env=names).select(SelectConfig(limit=3))]
    assert taken == both[:3] and {x.split("/")[0] for x in taken} == set(names)


def test_in_turn_skips_groups_that_run_out():
    from verifiers_nemogym.taskset import in_turn

    assert list(in_turn([[1, 2, 3], [], [4], [5, 6]])) == [1, 4, 5, 2, 6, 3]
    assert list(in_turn([])) == []
