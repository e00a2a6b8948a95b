"""What `metrics` reads from traces and hands NeMo Gym's `/aggregate_metrics`: the same episodes
from a vf-eval run folder, its traces.jsonl and prime-rl's stream folder (plain and sealed zstd
chunks); failed rollouts left out; task and rollout indices as NeMo Gym numbers its rows. The
numbers themselves are NeMo Gym's: tests/stack/test_metrics.py compares them with its own eval."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest
import zstandard
from verifiers.v1.trace import AgentInfo, Trace, TraceTask

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.harness import record
from verifiers_nemogym.metrics import collect, read_episodes, runs

RUNTIME = {"nemo_gym": "0.4.0", "python": "3.12.1", "below_floor": False}


def _episode(name: str, reward: float | None, agent: str = "mcqa_simple_agent") -> dict[str, Any]:
    """A verifiers episode as traces.jsonl holds it; `reward` None: a failed rollout."""
    data = {"name": name, "agent": agent, "row": {"responses_create_params": {"input": name}}}
    info: dict[str, Any] = {"nemo_gym_runtime": RUNTIME}
    errors = []
    if reward is None:
        errors = [{"type": "AgentRunError", "message": "judge failed"}]
    else:
        info["nemo_gym"] = {"reward": reward, "extracted_answer": "A",
                            "response": {"usage": {"input_tokens": 3}}}  # fmt: skip
    trace = {"task": {"type": "NeMoGymTask", "data": data}, "info": info, "errors": errors}
    return {"task": {"type": "NeMoGymTask", "data": data}, "ok": reward is not None,
            "traces": [trace]}  # fmt: skip


EPISODES = [
    _episode("mcqa/example:10", 1.0),
    _episode("mcqa/example:2", 0.0),
    _episode("mcqa/example:10", 0.0),
    _episode("mcqa/example:2", None),
    _episode("mcqa/example:2", 1.0),
    _episode("other/example:1", 0.5, agent="other_agent"),
]


def _write(path: Path, episodes: list[dict[str, Any]]) -> bytes:
    text = "".join(json.dumps(e) + "\n" for e in episodes).encode()
    path.write_bytes(text)
    return text


def test_a_run_folder_its_traces_and_a_prime_rl_stream_folder_read_the_same(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    _write(run / "traces.jsonl", EPISODES)
    stream = tmp_path / "out" / "monitors/file/traces/stream"
    stream.mkdir(parents=True)
    (stream / "000000.jsonl.zst").write_bytes(
        zstandard.compress(_write(tmp_path / "x", EPISODES[:4]))
    )
    _write(stream / "000001.jsonl", EPISODES[4:])
    (stream / "notes.txt").write_text("not a chunk")
    for path in (run, run / "traces.jsonl", stream, tmp_path / "out"):
        assert read_episodes(path) == EPISODES, path


def test_reading_traces_runs_no_garbage_collection(tmp_path: Path):
    """A vf-eval process reads its run's traces at its close, its heap full of the run's
    objects: Python's cycle collector, run again and again as the parsed episodes pile up,
    took 278 of the 289 ms of reading 100 traces there. Parsed JSON has no cycles: none runs
    while traces are read (the collector's own state is as it was after)."""
    _write(tmp_path / "traces.jsonl", EPISODES * 500)
    collections: list[int] = []

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(count)
    try:
        episodes = read_episodes(tmp_path)
    finally:
        gc.callbacks.remove(count)
    # At most the one young-generation pass the re-enabled collector owes the allocations
    # (before the pause: 72 passes, 3000 episodes on a near-empty heap).
    assert len(episodes) == 3000 and len(collections) <= 1 and gc.isenabled(), collections
    gc.disable()
    try:
        read_episodes(tmp_path)
        assert not gc.isenabled()  # a caller's own choice stands
    finally:
        gc.enable()


def test_bad_trace_files_name_file_and_line(tmp_path: Path):
    (tmp_path / "traces.jsonl").write_text(json.dumps(EPISODES[0]) + "\n{not json\n")
    with pytest.raises(ConfigError, match=r"traces.jsonl:2: not a JSON episode"):
        read_episodes(tmp_path)
    (tmp_path / "broken.jsonl.zst").write_bytes(b"\x00not zstd")
    with pytest.raises(ConfigError, match=r"broken.jsonl.zst"):
        read_episodes(tmp_path / "broken.jsonl.zst")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no traces here"):
        read_episodes(tmp_path / "empty")
    with pytest.raises(ConfigError, match="no such file or folder"):
        read_episodes(tmp_path / "missing")


def test_collect_leaves_failures_out_and_numbers_tasks_and_rollouts_as_nemo_gym_does():
    found = collect(EPISODES)
    assert found.failed == 1 and found.runtime == RUNTIME
    assert list(found.by_agent) == ["mcqa_simple_agent", "other_agent"]
    mcqa = found.by_agent["mcqa_simple_agent"]
    # Tasks in environment-then-line order (line 2 before line 10), rollouts in file order.
    assert [(r["_ng_task_index"], r["_ng_rollout_index"], r["reward"]) for r in mcqa] == [
        (0, 0, 0.0), (0, 1, 1.0), (1, 0, 1.0), (1, 1, 0.0),
    ]  # fmt: skip
    assert mcqa[0]["response"] == {"usage": {"input_tokens": 3}}
    assert found.by_agent["other_agent"][0]["_ng_task_index"] == 2
    assert found.rows["other_agent"] == {"responses_create_params": {"input": "other/example:1"}}


def test_traces_of_two_runtimes_are_refused():
    other = _episode("mcqa/example:3", 1.0)
    other["traces"][0]["info"]["nemo_gym_runtime"] = {**RUNTIME, "nemo_gym": "0.7.0"}
    with pytest.raises(ConfigError, match="several NeMo Gym runtimes"):
        collect([*EPISODES, other])


def test_record_keeps_of_the_response_only_what_nemo_gyms_metrics_read():
    usage = {"input_tokens": 12, "output_tokens": 5, "total_tokens": 17}
    result = {"reward": 1.0, "response": {"output": [{"type": "message"}], "usage": usage,
              "incomplete_details": None}}  # fmt: skip
    trace = Trace(task=TraceTask(type="test", data={}), agent=AgentInfo(config={}))
    record(trace, result)
    assert trace.info["nemo_gym"] == {"reward": 1.0, "response": {"usage": usage}}


def test_the_run_folder_is_the_one_whose_eval_log_this_process_holds_open(tmp_path: Path):
    """vf-eval tees its log to `<run>/logs/attempt_<n>/eval.log` and keeps it open."""
    from verifiers_nemogym.metrics import run_folder

    assert run_folder() is None
    log = tmp_path / "logs" / "attempt_1" / "eval.log"
    log.parent.mkdir(parents=True)
    with log.open("a"):
        assert run_folder() is None  # no traces.jsonl: not a run folder
        (tmp_path / "traces.jsonl").touch()
        assert run_folder() == tmp_path
    assert run_folder() is None


def test_metrics_command_on_bad_input_is_a_one_line_error_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], launches
):
    """No traces, or traces with no successful rollout: exit 2, one line, no stack started."""
    from verifiers_nemogym.cli import main

    _write(tmp_path / "traces.jsonl", [_episode("mcqa/example:1", None)])
    assert main(["metrics", str(tmp_path), "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip() == f"nemo-gym-env: {tmp_path}: no successful NeMo Gym rollout to aggregate"
    assert main(["metrics", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"nemo-gym-env: no such file or folder: {tmp_path / 'missing'}"
    )
    assert launches.stacks == []


def test_a_vf_eval_output_folder_holds_its_runs(tmp_path: Path):
    """`vf-eval -o out` writes `out/<run>/traces.jsonl`: the folder is its runs; one run alone is
    that run. prime-rl's output folder with several runs' stream folders likewise."""
    out = tmp_path / "out"
    (out / "b-run").mkdir(parents=True)
    _write(out / "b-run" / "traces.jsonl", EPISODES)
    assert runs(out) == [out / "b-run"]
    (out / "a-run").mkdir()
    _write(out / "a-run" / "traces.jsonl", EPISODES[:2])
    (out / "notes").mkdir()
    assert runs(out) == [out / "a-run", out / "b-run"]
    assert read_episodes(runs(out)[0]) == EPISODES[:2]
    assert runs(out / "a-run") == [out / "a-run"]  # a run folder, a traces file: themselves
    assert runs(out / "a-run" / "traces.jsonl") == [out / "a-run" / "traces.jsonl"]
    prime = tmp_path / "prime"
    for name in ("r1", "r2"):
        (prime / name / "monitors/file/traces/stream").mkdir(parents=True)
        _write(prime / name / "monitors/file/traces/stream" / "000000.jsonl", EPISODES)
    assert runs(prime) == [prime / n / "monitors/file/traces/stream" for n in ("r1", "r2")]
    (tmp_path / "empty" / "run").mkdir(parents=True)
    with pytest.raises(ConfigError, match="no traces here"):
        runs(tmp_path / "empty")


def test_metrics_refuses_a_path_without_traces_before_importing_verifiers(tmp_path: Path):
    """In a fresh interpreter: no traces at all is exit 2 with one line, and neither verifiers
    nor the env package (what starting a stack needs) was imported."""
    import subprocess
    import sys

    (tmp_path / "run" / "logs").mkdir(parents=True)
    probe = (
        "import sys; from verifiers_nemogym.cli import main; "
        f"code = main(['metrics', {str(tmp_path)!r}]); "
        "print(code, sorted(m for m in ('verifiers', 'nemo_gym_env') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "2 []", done.stderr
    assert done.stderr.strip() == f"nemo-gym-env: {tmp_path}: no traces here " + (
        "(a vf-eval output folder or run folder with traces.jsonl, a traces file, or prime-rl's "
        "monitors/file/traces/stream/ folder of *.jsonl[.zst] chunks)"
    )


def test_metrics_on_runs_without_a_successful_rollout_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], launches
):
    from verifiers_nemogym.cli import main

    for name in ("run1", "run2"):
        (tmp_path / name).mkdir()
        _write(tmp_path / name / "traces.jsonl", [_episode("mcqa/example:1", None)])
    assert main(["metrics", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"nemo-gym-env: {tmp_path}: no successful NeMo Gym rollout to aggregate in any run"
    )
    assert launches.stacks == []


async def test_which_agents_keep_nemo_gyms_default_aggregate(nemo_venv, nemo_venv_07, launches):
    """Read by the runtime's own code, nothing started: a coding-agent harness agent (0.7.0)
    keeps NeMo Gym's default `/aggregate_metrics` and is computed here (`mean/reward` of its
    rewards); simple_agent (0.4.0) forwards it to its resources server, so a stack must answer."""
    from verifiers_nemogym.metrics import Rollouts, default_aggregates

    results = [{"reward": r, "_ng_task_index": i, "_ng_rollout_index": 0}
               for i, r in enumerate([1.0, 0.0, 1.0, 1.0])]  # fmt: skip
    harness = Rollouts(by_agent={"opencode_math_agent": results})
    (entry,) = (await default_aggregates(nemo_venv_07, harness)).values()
    assert entry["agent_ref"] == {"name": "opencode_math_agent"}
    assert entry["agent_metrics"]["mean/reward"] == 0.75
    assert entry["key_metrics"]["mean/reward"] == 0.75
    classic = Rollouts(by_agent={"mcqa_simple_agent": results})
    assert await default_aggregates(nemo_venv, classic) == {}
    assert launches.stacks == []
