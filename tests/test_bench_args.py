"""The benchmark command line (fast tier, nothing started): which figures may run another
nemo-gym release, and that ours is then told exactly the release and Python native runs."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest

import benchmarks.__main__ as bench
from benchmarks import common
from verifiers_nemogym.nemo.venv import NeMoGymVenv

FLAGS = ["--nemo-gym-version", "0.7.0", "--python", "/py/3.13.0/bin/python3"]


@pytest.fixture(autouse=True)
def bytecode_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)


def test_a_run_without_cached_bytecode_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both sides' processes would compile every module at each start: the start figures
    would measure the compiler (a warm vf-eval's start 9.8 s against 4.4 s)."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    with pytest.raises(SystemExit) as exited:
        bench.parse_args(["--only", "warm"])
    assert exited.value.code == 2
    assert "PYTHONDONTWRITEBYTECODE is set" in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize(
    "only", [["e2e"], ["warm"], ["e2e", "warm"], ["start"], ["e2e", "start", "warm"]]
)
def test_release_figures_accept_another_release(only: list[str]) -> None:
    args = bench.parse_args(
        ["--only", *only, *FLAGS, "--allow-python-below-floor", "--cold-repeats", "0"]
    )
    assert (args.only, args.nemo_gym_version, args.allow_python_below_floor) == (
        only,
        "0.7.0",
        True,
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([*FLAGS], "needs --only"),  # every figure, proxy and steady included
        (["--only", "steady", *FLAGS], "needs --only"),
        (["--only", "e2e", "proxy", *FLAGS], "needs --only"),
        (["--only", "start", *FLAGS], "--cold-repeats 0"),  # default 1 cold start
        (["--only", "e2e", "--python", "/py/bin/python3"], "go with --nemo-gym-version"),
        (["--only", "e2e", "--allow-python-below-floor"], "go with --nemo-gym-version"),
    ],
)
def test_bad_combinations_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        bench.parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err.splitlines()[-1]


def test_ours_runs_the_release_and_python_native_runs() -> None:
    runtime = NeMoGymVenv(
        venv=Path("/cache/nemo-gym-0.7.0-py3.13.0-below-floor"),
        python=Path("/py/3.13.0/bin/python3"),
        python_version="3.13.0",
        nemo_gym_version="0.7.0",
        below_floor=True,
        python_floor="3.13.14",
    )
    cmd = common.vf_eval_command(runtime, "http://127.0.0.1:9/v1", Path("/out"), private_stack=True)
    pairs = dict(itertools.pairwise(cmd))
    assert pairs["--env.taskset.nemo-gym-version"] == "0.7.0"
    assert pairs["--env.taskset.python"] == "/py/3.13.0/bin/python3"
    assert pairs["--env.taskset.allow-python-below-floor"] == "True"
    assert pairs["--env.taskset.shared-stack"] == "False"
    shared = common.vf_eval_command(
        dataclasses.replace(runtime, below_floor=False),
        "http://127.0.0.1:9/v1",
        Path("/out"),
        private_stack=False,
    )
    assert "--env.taskset.shared-stack" not in shared
    assert "--env.taskset.allow-python-below-floor" not in shared
