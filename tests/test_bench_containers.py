"""The container benchmark's committed results (fast tier, nothing started): native NeMo Gym and
nemo-gym-env gave every row the same reward, the one its fixer case calls for, at every level of
rollouts in flight, with docker's containers and with OpenSandbox's sandboxes; each side's phases
add up; and the docs quote the results' tables."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import containers
from verifiers_nemogym.phases import PHASES

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks/results/2026-11-28-containers.json"
"""terminal_bench_2_1 at `-c 1, 2`, two rounds (a loaded machine)."""
LEVELS = ROOT / "benchmarks/results/2026-11-28-containers-levels.json"
"""swebench_pro, terminal_bench_2_1 and swe_next at `-c 1, 2, 4`, one round each."""
REPEATS = ROOT / "benchmarks/results/2026-11-28-containers-repeats.json"
"""The three at `-c 1, 2`, two rounds each (a quiet machine)."""
NO_RETRIES = ROOT / "benchmarks/results/2026-11-29-containers.json"
"""terminal_bench_2_1 and swebench_pro at `-c 1, 2, 4`, two rounds each, after the stack's
containers got apt without retries."""
SWE_NEXT = ROOT / "benchmarks/results/2026-11-29-containers-swe-next.json"
"""swe_next at `-c 1, 2, 4`, two rounds each (after the apt change)."""
SWEBENCH_C4 = ROOT / "benchmarks/results/2026-11-29-containers-swebench-pro-c4.json"
"""swebench_pro at `-c 1, 4`, three rounds each."""
SWEBENCH_C1 = ROOT / "benchmarks/results/2026-11-29-containers-swebench-pro-c1.json"
"""swebench_pro at `-c 1`, three rounds, right after."""
FOCUS = {
    RESULT: "terminal_bench_2_1",
    LEVELS: "terminal_bench_2_1",
    REPEATS: "terminal_bench_2_1",
    NO_RETRIES: "terminal_bench_2_1",
    SWE_NEXT: "swe_next",
    SWEBENCH_C4: "swebench_pro",
    SWEBENCH_C1: "swebench_pro",
}
"""The environment each result was run for: it must be there, measured on both sides."""
DOCKER_RESULTS = pytest.mark.parametrize(
    "path",
    list(FOCUS),
    ids=[
        "c12",
        "c124",
        "c12-three",
        "c124-no-retries",
        "c124-swe-next",
        "c14-swebench-pro",
        "c1-swebench-pro",
    ],
)
OPENSANDBOX = ROOT / "benchmarks/results/2026-11-28-opensandbox.json"
"""`--provider opensandbox`: native and ours through NeMo Gym's opensandbox.yaml."""
PROVIDERS = ROOT / "benchmarks/results/2026-11-28-providers.json"
"""`--provider docker --provider opensandbox`: the four sides in one run."""


@DOCKER_RESULTS
def test_every_measured_side_scores_each_row_as_its_case_calls_for(path: Path) -> None:
    """Every rollout of a side that ran, at every level, got the reward its fixer case calls
    for (so native and ours agree where both ran), and nothing of it was left running."""
    result = json.loads(path.read_text())
    assert "rewards" in result["envs"][FOCUS[path]]["ours"]
    for name, entry in result["envs"].items():
        for side in (entry[s] for s in ("native", "ours") if "rewards" in entry[s]):
            assert side["rewards"] == result["expected_rewards"], name
            for rewards in side["timed_rewards"]:
                assert rewards == result["expected_rewards"], name
            # a run cut short leaves the containers of the batch it cut (counted, then removed)
            assert side["containers_left"] == 0 or "cut_short" in result, name
            assert [int(k) for k in side["levels"]] == result["levels"], name


@DOCKER_RESULTS
def test_the_sides_ran_interleaved_on_both_container_environments(path: Path) -> None:
    """Every environment of the result (the one it was run for among them) ran on both sides; at
    every level each side ran `repeats` rounds, the two sides' batches of a round one after the
    other with the order turned every round, and each batch recorded the host's CPU busy share
    and load average."""
    result = json.loads(path.read_text())
    assert result["interleaved"] is True and result["repeats"] >= (1 if path == LEVELS else 2)
    assert FOCUS[path] in result["envs"]
    for name, entry in result["envs"].items():
        for level in result["levels"]:
            native = entry["native"]["levels"][str(level)]["batches"]
            ours = entry["ours"]["levels"][str(level)]["batches"]
            # every round of a level ran on both sides; a run cut short (`cut_short`) may end
            # with a level of fewer rounds than `repeats`, never the first
            rounds = list(range(len(native) if "cut_short" in result else result["repeats"]))
            assert rounds and [b["repeat"] for b in native] == rounds, name
            assert [b["repeat"] for b in ours] == rounds, name
            if level == result["levels"][0]:
                assert len(rounds) == result["repeats"], name
            for n, o in zip(native, ours, strict=True):
                assert n["position"] + o["position"] == 1, (name, level)
                assert n["position"] == n["repeat"] % 2, (name, level)  # native first, then ours
                for b in (n, o):
                    assert 0 < b["cpu_busy"] <= 1 and len(b["load_before"]) == 3, (name, level)
                    assert b["rollouts"] == level * len(result["cases"]), (name, level)


def test_the_ratio_is_the_median_of_the_rounds_ratios() -> None:
    """A level's ours / native is taken within each round (the same load), then the median; a
    result without rounds falls back to the totals."""
    native = {"per_minute": 3.0, "batches": [
        {"repeat": 0, "per_minute": 2.0}, {"repeat": 1, "per_minute": 4.0},
        {"repeat": 2, "per_minute": 1.0},
    ]}  # fmt: skip
    ours = {"per_minute": 2.0, "batches": [
        {"repeat": 0, "per_minute": 1.0}, {"repeat": 1, "per_minute": 4.0},
        {"repeat": 2, "per_minute": 0.9},
    ]}  # fmt: skip
    assert containers.ratio(native, ours) == 0.9  # rounds: 0.5, 1.0, 0.9; totals would say 0.67
    assert containers.ratio({"per_minute": 2.0}, {"per_minute": 1.0}) == 0.5


@DOCKER_RESULTS
def test_each_sides_phases_add_up_to_its_rollouts_time(path: Path) -> None:
    """Each one-at-a-time rollout's phases add up to its `/run`, and `/run` plus the rest to its
    wall time; so do their means (the phase table). A result of before per-rollout phases
    (`phases_of` "median": each phase's median, which need not add up) is checked per phase:
    each median lies within the rollout's wall time."""
    result = json.loads(path.read_text())
    for name, entry in result["envs"].items():
        for side in ("native", "ours"):
            if "phases" not in entry[side]:
                continue  # the side did not run (its error is in the result)
            phases = entry[side]["phases"]
            if entry[side].get("phases_of", "median") == "median":
                assert all(0 <= phases[p] <= phases["wall"] for p in PHASES), (name, side)
                continue
            for each in [*entry[side]["phases_each"], phases]:
                assert abs(sum(each[p] for p in PHASES) - each["run"]) <= 0.05, (name, side)
                assert abs(each["run"] + each["other"] - each["wall"]) <= 0.05, (name, side)


@DOCKER_RESULTS
def test_tables_render_and_the_docs_quote_them(path: Path) -> None:
    """docs/containers.md quotes the parity table and docs/performance.md the phase and rate
    tables of the committed result, row for row (a rerun that changes a figure fails here until
    the pages quote it)."""
    result = json.loads(path.read_text())
    parity = containers.table(result)
    assert len(parity) == 2 + len(result["envs"])
    assert any(row.startswith(f"| {FOCUS[path]} | ") for row in parity[2:])
    doc = (ROOT / "docs/containers.md").read_text().splitlines()
    assert [row for row in parity if row not in doc] == []
    phases, rates = containers.phase_table(result), containers.rate_table(result)
    ran = [
        (n, s) for n, e in result["envs"].items() for s in ("native", "ours") if "phases" in e[s]
    ]
    assert len(phases) == 2 + len(ran)
    performance = (ROOT / "docs/performance.md").read_text().splitlines()
    assert [row for row in phases + rates if row not in performance] == []


def test_table_shows_a_failed_side() -> None:
    ours = {"rewards": [1.0, 0.0], "s_per_rollout": 2.345}
    result = {"envs": {"x": {"native": {"error": "boom"}, "ours": ours}}}
    assert containers.table(result)[2] == "| x | error | 1, 0 | error | 2.3 |"
    assert containers.phase_table(result) == containers.phase_table({"envs": {}})


def test_swe_next_scores_natively() -> None:
    """swe_next's row natively (the 2026-11-27 run's `/run` had answered 500 on it): both cases
    scored as the fixer calls for, each with its fix and final call, no container left."""
    result = json.loads((ROOT / "benchmarks/results/2026-11-28-swe-next-native.json").read_text())
    native = result["envs"]["swe_next"]["native"]
    assert native["rewards"] == result["expected_rewards"]
    assert native["calls_by_case"] == [{"fix": 1, "final": 1}] * len(result["cases"])
    assert native["containers_left"] == 0


@pytest.mark.parametrize("path", [OPENSANDBOX, PROVIDERS], ids=["opensandbox", "providers"])
def test_opensandbox_scores_each_row_alike_natively_and_ours(path: Path) -> None:
    """`--provider opensandbox` (and with docker too) on swebench_pro and terminal_bench_2_1:
    native NeMo Gym and nemo-gym-env, through NeMo Gym's shipped opensandbox.yaml (and
    docker.yaml), gave each row the reward its fixer case calls for (right fix 1, useless edit
    0) in every batch, each row with one fix and one final call; the parity line names every
    side and says they agree; no sandbox was left on the server's list and no container of any
    side in docker."""
    result = json.loads(path.read_text())
    providers = result["providers"]
    assert "opensandbox" in providers
    sides = [containers.side_name(s, p) for p in providers for s in containers.SIDES]
    assert set(result["envs"]) == {"swebench_pro", "terminal_bench_2_1"}
    assert result["expected_rewards"] == [1.0, 0.0]
    assert result["opensandbox_server"]["sandboxes_left"] == 0
    for name, entry in result["envs"].items():
        assert (
            containers.PROVIDER_CONFIG.format(name="opensandbox")
            in (entry["opensandbox_config_paths"])
        ), name
        assert entry["parity"] == {"sides": sides, "equal": True}, name
        for side in (entry[s] for s in sides):
            assert side["rewards"] == result["expected_rewards"], name
            assert all(r == result["expected_rewards"] for r in side["timed_rewards"]), name
            assert side["calls_by_case"] == [{"fix": 1, "final": 1}] * len(result["cases"])
            assert side["containers_left"] == 0 and side["complete"], name


@pytest.mark.parametrize("path", [OPENSANDBOX, PROVIDERS], ids=["opensandbox", "providers"])
def test_opensandbox_tables_render_and_the_docs_quote_them(path: Path) -> None:
    """Each OpenSandbox result's parity table has a column pair per side it ran, and
    docs/containers.md quotes it row for row."""
    result = json.loads(path.read_text())
    parity = containers.table(result)
    sides = [s for p in result["providers"] for s in (f"native-{p}", f"ours-{p}")]
    sides = [s.removesuffix("-docker") for s in sides]
    assert parity[0] == (
        "| environment | "
        + " | ".join([f"rewards {s}" for s in sides] + [f"s/rollout {s}" for s in sides])
        + " |"
    )
    doc = (ROOT / "docs/containers.md").read_text().splitlines()
    assert [row for row in parity if row not in doc] == []


def test_sides_are_named_by_provider_and_the_tables_take_any_of_them() -> None:
    """docker's sides keep their names (`native`, `ours`), another provider's are suffixed; the
    parity table has a column pair per side present, in docker-then-OpenSandbox order; `parity`
    compares the sides that scored."""
    assert containers.side_name("native", "docker") == "native"
    assert containers.side_name("ours", "opensandbox") == "ours-opensandbox"
    assert containers.side_kind("ours-opensandbox") == ("ours", "opensandbox")
    assert containers.side_kind("native") == ("native", "docker")
    ok = {"rewards": [1.0, 0.0], "s_per_rollout": 2.0}
    entry = {"ours-opensandbox": ok, "native": ok, "native-opensandbox": {"error": "boom"}}
    result = {"envs": {"x": entry}}
    assert containers.table(result)[2] == "| x | 1, 0 | error | 1, 0 | 2.0 | error | 2.0 |"
    sides = containers.sides_of(result)
    assert sides == ["native", "native-opensandbox", "ours-opensandbox"]
    assert containers.parity(entry, sides) == {
        "sides": ["native", "ours-opensandbox"],
        "equal": True,
    }
    entry["native"] = {"rewards": [1.0, 1.0]}
    assert containers.parity(entry, sides)["equal"] is False


def test_the_native_docker_override_is_as_before_providers(tmp_path: Path) -> None:
    """Native docker's own config: the containers on the host's network with the run's label,
    the agent's artifacts in the run's folder (what the docker results were measured with)."""
    got = containers.native_override("agent", tmp_path, "run", containers.DOCKER_SANDBOXES)
    create = {"network": "host", "extra_run_args": ["--label", f"{containers.RUN_LABEL}=run"]}
    impl = {"opencode_sandboxed_agent": {"artifacts_dir": str(tmp_path)}}
    assert got == {"sandbox": {"docker": {"create": create}}, "agent": {containers.AGENTS: impl}}


CUT_SHORT = """
import asyncio, contextlib, signal, types
from benchmarks import containers

# Ctrl-C as a terminal's process gets it, whatever this test's worker passed on (an ignored
# SIGINT is inherited across exec, and asyncio then installs no handler of its own).
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.asynccontextmanager
async def side(*_args):
    async def one(case):
        print("rollout", flush=True)
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            # as the native side's `docker rm -f` racing NeMo Gym's own teardown did
            raise RuntimeError("cleanup failed while cut short") from None
        return containers.Rollout(0.0, 0.0, case, 1.0)

    yield containers.Running(one, 0.0, None, [])


containers.SIDES.update(native=side, ours=side)


async def main():
    for env in ("first", "second"):
        task = types.SimpleNamespace(env=env)
        await containers.measure_env(
            None, task, "agent", None, [None], ["native", "ours"], (1,), 2, lambda _: None
        )
        print("went on after", env, flush=True)


asyncio.run(main())
"""
"""The benchmark's own `measure_env` (sides, interleaved rounds, batches) on stand-in sides whose
rollout, cut short, fails in its cleanup."""


def test_ctrl_c_stops_the_run_even_when_a_cleanup_fails() -> None:
    """SIGINT (Ctrl-C) during a batch stops the benchmark: the cleanup's error, raised while the
    run is being cancelled, ends it (exit status not 0, the error shown) instead of becoming the
    side's result, after which the run went on with the other side and the next environment
    (the reported "ignores Ctrl-C"; SIGTERM, with no handler, just ended the process)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CUT_SHORT], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        while (line := proc.stdout.readline()) != "rollout\n":  # the sides' "up" lines first
            assert line, proc.stderr and proc.stderr.read()
        time.sleep(0.5)  # into the rollout's sleep
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            # Say how the process took the signal (once seen in CI: silent for 60 s).
            status = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
            masks = [line for line in status if line.startswith(("SigBlk", "SigIgn", "SigCgt"))]
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"running 60 s after SIGINT ({masks}); out {out!r}, err {err[-2000:]!r}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, (out, err)
    assert "went on" not in out and "rollout" not in out, out
    assert "RuntimeError: cleanup failed while cut short" in err, err
