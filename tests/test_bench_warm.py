"""The warm figure's phase table (fast tier, no stack): boundaries read off what vf-eval and NeMo
Gym's collection write (their log lines, results files growing, a progress bar's `\\r` lines),
phases that add up to the wall time, a missing boundary an error naming it rather than a zero,
and the import profile's attribution."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
from pathlib import Path

import pytest

from benchmarks import warm
from benchmarks.common import REPEATS, ROWS
from benchmarks.timeline import (
    EXIT,
    OUTPUT,
    Event,
    PhaseError,
    Tail,
    import_profile,
    phases,
    watch,
)

N = ROWS * REPEATS
ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "benchmarks/results/2026-11-29-warm-cpu.json"
"""`--only warm --repeats 3 --nemo-gym-version 0.7.0`: both sides' phases, interleaved, and
each side's client CPU by owner."""

# vf-eval's eval.log as verifiers and our package write it (loguru's format, whole seconds).
EVAL_LOG = """\
17:48:14    INFO running 5x20 rollouts on scripted
17:48:14    INFO vf-eval will be deprecated - move to prime-rl's `uv run eval`: it streams traces
17:48:14    INFO results: /tmp/out/nemo-gym-env--scripted--nemo-gym-env--6b0d46f2
17:48:14    INFO interception up: url=http://127.0.0.1:46327
17:48:14    INFO interception pool: 1 server(s), multiplex=32
17:48:14    INFO NeMo Gym 0.7.0 on Python 3.13.0 (runtime nemo-gym-0.7.0-py3.13.0)
17:48:14    INFO model proxy listening on http://127.0.0.1:44731
17:48:14    INFO attached to shared NeMo Gym stack in 0.002 s (host pid 3206, head http://127.0.0.1:27171, 1 agents; model proxy on http://127.0.0.1:44731)
17:48:14    INFO nemo-gym-env ready in 0.3 s (rows, proxy, stack): rollouts go to agents ['example_single_tool_call_simple_agent']
17:48:14    INFO rollout start: id=4f384100b9d14e868beddf46c8eeff1e task=0 harness=nemo-gym-env runtime=subprocess
"""  # noqa: E501
TRACE = '{"ok": true, "reward": 1.0, "info": {"nemo_gym_phases": {"run": 0.7}}}\n'
RESULT = '{"responses_create_params": {"input": []}, "reward": 1.0, "_ng_task_index": 0}\n'


def ours_timeline(tmp: Path, *, attached: bool = True) -> list[Event]:
    """A vf-eval run's timeline as `watch` records it: eval.log and traces.jsonl polled at the
    stamps of a run of 2026-11-28 (7.68 s to the log, 13.45 s to the exit)."""
    run = tmp / "out" / "nemo-gym-env--scripted--nemo-gym-env--6b0d46f2"
    log_dir = run / "logs" / "attempt_1"
    tails = [Tail(warm.EVAL_LOG, tmp / "out", "*/logs/attempt_*/eval.log"),
             Tail(warm.TRACES, tmp / "out", "*/traces.jsonl")]  # fmt: skip
    events: list[Event] = []

    def poll(t: float) -> None:
        for tail in tails:
            tail.poll(lambda: t, events)

    poll(0.02)  # nothing yet
    log_dir.mkdir(parents=True)
    (log_dir / "eval.log").write_text("")
    poll(7.68)
    lines = [
        line for line in EVAL_LOG.splitlines(keepends=True) if attached or "attached" not in line
    ]
    (run / "traces.jsonl").write_text("")
    with (log_dir / "eval.log").open("a") as log:
        log.write("".join(lines[:3]) + lines[3][:20])  # a line half written when polled
        log.flush()
        poll(7.70)
        log.write(lines[3][20:] + "".join(lines[4:]))
    poll(8.00)
    with (run / "traces.jsonl").open("a") as traces:
        traces.write(TRACE)
        traces.flush()
        poll(8.84)
        for i in range(1, N):
            traces.write(TRACE)
            traces.flush()
            if i % 10 == 0:
                poll(8.84 + i * 0.03)
    poll(11.92)
    with (log_dir / "eval.log").open("a") as log:
        log.write("17:48:17    INFO interception down: url=http://127.0.0.1:46327\n")
    poll(12.20)
    return [*events, Event(13.45, EXIT, "exit", "0")]


def test_ours_phases_come_from_its_log_and_traces(tmp_path: Path) -> None:
    events = ours_timeline(tmp_path)
    got = warm.ours_phases(events, 13.46)
    assert got == {"start": 7.68, "taskset": 0.02, "attach": 0.3, "first_rollout": 0.84,
                   "rest": 3.08, "close": 0.28, "exit": 1.25, "wall": 13.46,
                   "other": 0.01}  # fmt: skip
    assert warm.attached_s(events) == 0.002
    assert sum(got[p] for p, _ in warm.OURS_PHASES) + got["other"] == pytest.approx(got["wall"])


def test_a_missing_boundary_is_an_error_naming_it_not_a_zero(tmp_path: Path) -> None:
    events = ours_timeline(tmp_path, attached=False)
    with pytest.raises(PhaseError, match=r"ours: boundary 'attached' .*attached to shared"):
        warm.ours_phases(events, 13.46)
    with pytest.raises(RuntimeError, match="did not attach"):
        warm.attached_s(events)
    # a run that wrote fewer results than rollouts has no last result
    short = [e for e in ours_timeline(tmp_path / "again") if e.source != warm.TRACES or e.t < 9]
    with pytest.raises(PhaseError, match="'last_result'"):
        warm.ours_phases(short, 13.46)


# NeMo Gym 0.7's `gym eval run --no-serve` output, as it reaches the pipe (tqdm redraws with \r).
NATIVE_OUTPUT = [
    (6.223, "Clearing output fpath since `resume_from_cache=False`!\n"),
    (6.224, "Reading rows: 0it [00:00, ?it/s]\rReading rows: 5it [00:00, 33500.83it/s]\n"),
    (6.224, "Routing rows via agent_map {'_default': 'example_single_tool_call_simple_agent'}\n"),
    (6.225, "Querying with 20 concurrent requests\n"),
    (6.752, "Collecting rollouts:   0%|          | 0/100 [00:00<?, ?it/s]\r"),
    (8.100, "Finished rollout collection! View results at:\n"),
]


def native_timeline(tmp: Path) -> list[Event]:
    """A native collection's timeline: its output lines, its results file created at 6.235 s
    and grown a line per rollout (first 6.752 s, last 8.043 s), its exit at 9.752 s."""
    tail = Tail(warm.RESULTS, tmp, "rollouts.jsonl")
    events = [Event(t, OUTPUT, "line", line) for t, text in NATIVE_OUTPUT
              for line in text.replace("\r", "\n").splitlines() if line]  # fmt: skip
    tail.poll(lambda: 6.225, events)
    results = tmp / "rollouts.jsonl"
    results.write_text("")
    tail.poll(lambda: 6.235, events)
    with results.open("a") as out:
        for i in range(N):
            out.write(RESULT)
            out.flush()
            if (t := {0: 6.752, 50: 7.4, N - 1: 8.043}.get(i)) is not None:
                tail.poll(lambda t=t: t, events)
    events.append(Event(9.752, EXIT, "exit", "0"))
    return sorted(events, key=lambda e: e.t)


def test_native_phases_come_from_its_output_and_results_file(tmp_path: Path) -> None:
    got = warm.native_phases(native_timeline(tmp_path), 9.752)
    assert got == {"start": 6.223, "rows": 0.012, "first_rollout": 0.517, "rest": 1.291,
                   "close": 0.057, "exit": 1.652, "wall": 9.752, "other": 0.0}  # fmt: skip


def test_native_without_its_first_line_names_that_boundary(tmp_path: Path) -> None:
    events = [e for e in native_timeline(tmp_path) if "Clearing output" not in e.text]
    with pytest.raises(PhaseError, match="native: boundary 'collection_began'"):
        warm.native_phases(events, 9.752)


def test_phases_refuse_boundaries_out_of_order_and_a_wall_they_miss() -> None:
    order = [("a", "x"), ("b", "y")]
    with pytest.raises(PhaseError, match=r"'y' at 1\.000 s comes before 'x' at 2\.000 s"):
        phases({"x": 2.0, "y": 1.0}, order, 2.0, "ours")
    with pytest.raises(PhaseError, match=r"add up to 2\.000 s of 3\.000 s wall"):
        phases({"x": 1.0, "y": 2.0}, order, 3.0, "ours")
    assert phases({"x": 1.0, "y": 2.0}, order, 2.05, "ours")["other"] == 0.05


CHILD = r"""
import sys, time
from pathlib import Path
out = Path(sys.argv[1])
print("Clearing output fpath since `resume_from_cache=False`!", flush=True)
sys.stderr.write("Reading rows: 0it\rReading rows: 5it\n"); sys.stderr.flush()
time.sleep(0.2)
with out.open("a") as f:
    time.sleep(0.2)
    for i in range(100):
        f.write('{"reward": 1.0}\n'); f.flush(); time.sleep(0.005)
time.sleep(0.2)
print("Finished rollout collection! View results at:", flush=True)
time.sleep(0.2)
"""


def test_watch_stamps_a_real_process_output_and_file_as_they_appear(tmp_path: Path) -> None:
    """`watch` on a real child that prints, then grows a results file: the native boundaries
    in order, each after what precedes it in the child by at least its sleeps."""
    out = tmp_path / "rollouts.jsonl"
    cmd = [sys.executable, "-c", CHILD, str(out)]
    run = asyncio.run(watch(cmd, [Tail(warm.RESULTS, tmp_path, out.name)], env={}, cwd=tmp_path))
    assert run.returncode == 0
    lines = [e.text for e in run.events if e.source == OUTPUT]
    assert lines[1:3] == ["Reading rows: 0it", "Reading rows: 5it"]  # split at the \r
    got = warm.native_phases(run.events, run.wall)
    assert got["rows"] >= 0.15 and got["first_rollout"] >= 0.15
    assert got["close"] >= 0.15 and got["exit"] >= 0.15
    assert got["rest"] >= 0.4  # 99 sleeps of 5 ms, less a late first poll
    assert got["other"] == 0.0


# `python -X importtime` lines: children before the module that imported them.
IMPORTS = """\
import time: self [us] | cumulative | imported package
import time:    100000 |     100000 |   encodings.utf_8
import time:    200000 |     300000 | encodings
import time:   1000000 |    1000000 |         anthropic._client
import time:   2000000 |    3000000 |       anthropic
import time:    500000 |    3500000 |     verifiers.v1.dialects
import time:    400000 |    3900000 |   verifiers.v1
import time:    300000 |     300000 |       packaging.specifiers
import time:    100000 |     400000 |     verifiers_nemogym.containers.sandbox
import time:     50000 |     450000 |   verifiers_nemogym
import time:     10000 |    4360000 | nemo_gym_env
"""


def test_import_profile_counts_a_module_for_whoever_imported_it_first() -> None:
    got = import_profile("vf-eval's stderr\n" + IMPORTS)
    assert got["total_s"] == 4.66
    # anthropic under verifiers is verifiers'; packaging under our package is ours
    assert got["by_owner"] == {"other": 0.3, "ours": 0.46, "verifiers": 3.9}
    assert got["by_package"] == {"anthropic": 3.0, "verifiers": 0.9, "packaging": 0.3,
                                 "encodings": 0.3, "verifiers_nemogym": 0.15,
                                 "nemo_gym_env": 0.01, "rest": 0.0}  # fmt: skip
    with pytest.raises(PhaseError, match="no `import time:` lines"):
        import_profile("vf-eval's stderr\n")


def test_the_committed_run_has_both_sides_phases_adding_up_to_each_wall() -> None:
    """Every repeat of each side (ours, ours with `--no-rich`, native) has every phase (none
    negative), adding up to its wall time within 5 % with `other` the rest; the walls are the
    figure's own; the medians are over the repeats; the load averages and the import profiles
    of ours and native are recorded."""
    result = json.loads(RUN.read_text())
    found = result["details"]["warm_phases"]
    sides = (
        ("ours", warm.OURS_PHASES), (warm.NO_RICH, warm.OURS_PHASES),
        ("native", warm.NATIVE_PHASES),
    )  # fmt: skip
    for side, order in sides:
        names = [phase for phase, _ in order]
        each = found[side]["each"]
        assert len(each) == 3, side
        for run in each:
            covered = sum(run[name] for name in names)
            assert min(run[name] for name in names) >= 0, side
            assert abs(run["wall"] - covered) <= 0.05 * run["wall"], side
            assert run["other"] == pytest.approx(run["wall"] - covered, abs=0.002), side
        walls = result["details"]["end_to_end_warm_s"][side]["values"]
        assert [run["wall"] for run in each] == pytest.approx(walls, abs=0.001), side
        for name in [*names, "wall", "other"]:
            median = statistics.median(run[name] for run in each)
            assert found[side]["phases"][name] == pytest.approx(median, abs=0.001), (side, name)
        assert set(found[side]["boundaries"]) == set(names), side
        if side != warm.NO_RICH:
            assert found[side]["imports"]["total_s"] > 0, side
    assert len(found["load_avg_before"]) == len(found["load_avg_after"]) == 3


def test_the_docs_quote_the_committed_phase_table() -> None:
    table = warm.phase_table(json.loads(RUN.read_text())["details"]["warm_phases"])
    assert len(table) == 5 and table[2].startswith("| ours | ")
    assert table[3].startswith(f"| {warm.NO_RICH} (`--no-rich`) | ")
    performance = (ROOT / "docs/performance.md").read_text().splitlines()
    assert [row for row in table if row not in performance] == []


def test_the_committed_cpu_profile_charges_each_side_its_own_code_and_the_docs_quote_it() -> None:
    """vf-eval's CPU is ours, verifiers' and the event loop's, never NeMo Gym's; the collector's
    NeMo Gym's and the loop's, never ours or verifiers'; each side's total is its owners' sum;
    the docs' CPU table is the file's."""
    found = json.loads(RUN.read_text())["details"]["warm_phases"]
    ours, native = found["ours"]["cpu"], found["native"]["cpu"]
    assert set(ours["cpu_ms_per_rollout"]) == {"ours", "verifiers", "event_loop"}
    assert set(native["cpu_ms_per_rollout"]) == {"nemo_gym", "event_loop"}
    for side in (ours, native):
        assert side["rollouts"] == N and side["import_s"] > 0
        by = side["cpu_ms_per_rollout"]
        assert sum(by.values()) == pytest.approx(side["cpu_ms_per_rollout_total"], abs=0.05)
    assert 0 < ours["signature_ms_per_rollout"] < ours["cpu_ms_per_rollout"]["verifiers"]
    table = warm.cpu_table(found)
    assert len(table) == 4 and table[2].startswith("| ours | ")
    performance = (ROOT / "docs/performance.md").read_text().splitlines()
    assert [row for row in table if row not in performance] == []
