"""The tiers (tests/conftest.py), run on inner pytest sessions with this conftest and the
layout of tests/: a test outside stack/ that starts a stack fails before anything is spawned;
under stack/ (marked `stack` by its path, no mark written) the same start goes ahead; a model
server refusing bad input is allowed in the fast tier; a `stack` mark outside stack/ is refused.
And the pre-release selection (tests/run.sh runs the `verifiers_dev` tests on the verifiers
pre-release): a fast test file is in it by what it imports (tests/tiering.py), no list kept."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tiering import touches_verifiers

from verifiers_nemogym.nemo.venv import PYTHON_ENV_VAR, NeMoGymVenv
from verifiers_nemogym.util import CACHE_ENV_VAR, cache_root

CACHE = cache_root()  # read before pytester points HOME at a temporary folder
TESTS = Path(__file__).parent

PRELUDE = """
import pytest

from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.nemo.stack import NeMoGymStack
from verifiers_nemogym.nemo.venv import ensure_venv
from verifiers_nemogym.policies.local_model import LocalModelServer


def stack():
    config = [ensure_venv().site_packages / "resources_servers/example_single_tool_call"]
    return NeMoGymStack(ensure_venv(), config, policy_host="127.0.0.1", policy_port=9)
"""

INNER = (
    PRELUDE
    + """

async def test_unmarked_starts_a_stack():
    await stack().start()


def test_unmarked_model_server_refuses_bad_input(tmp_path, launches):
    with pytest.raises(ConfigError):
        LocalModelServer(gguf=tmp_path / "absent.gguf").start()
    assert len(launches.models) == 1
"""
)

INNER_STACK = (
    PRELUDE
    + """

async def test_marked_starts_a_stack(launches):
    started = stack()
    started._proc = object()  # the real start() then refuses at once: nothing is spawned
    with pytest.raises(StackError, match="already started"):
        await started.start()
    assert launches.stacks == [started.marker]
"""
)

INI = (  # tests/'s own pytest options, as pyproject.toml sets them
    "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = session\n"
    "pythonpath = .\naddopts = --import-mode=importlib\n"
    "markers =\n    stack: starts a NeMo Gym stack, a model or an install\n"
)


def inner_tests(pytester: pytest.Pytester, **files: str) -> None:
    """pytester's folder as tests/: this conftest, helpers and tiering, and `files` (name ->
    source)."""
    pytester.makeini(INI)
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    helpers = pytester.mkpydir("helpers")
    for module in (TESTS / "helpers").glob("*.py"):
        (helpers / module.name).write_text(module.read_text())
    pytester.makepyfile(tiering=(TESTS / "tiering.py").read_text())
    pytester.mkdir("stack")
    pytester.makepyfile(**files)


def test_guard_fails_unmarked_stack_starts_only(
    pytester: pytest.Pytester, nemo_venv: NeMoGymVenv, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The inner session must find this runtime venv, not build one under pytester's HOME.
    monkeypatch.setenv(CACHE_ENV_VAR, str(CACHE))
    monkeypatch.setenv(PYTHON_ENV_VAR, str(nemo_venv.python))
    inner_tests(pytester, test_inner=INNER, **{"stack/test_inner_stack": INNER_STACK})
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=600)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "E*Failed: this test starts a NeMo Gym stack: move it under tests/stack/*",
            "FAILED test_inner.py::test_unmarked_starts_a_stack*",
        ]
    )


def test_a_stack_mark_outside_the_stack_folder_is_refused(pytester: pytest.Pytester) -> None:
    marked = "import pytest\n\n\n@pytest.mark.stack\ndef test_marked_by_hand():\n    pass\n"
    inner_tests(pytester, test_inner=marked)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=600)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*marked `stack` outside tests/stack/*test_inner.py::test_marked*"]
    )


def _fast_tests(marks: str) -> set[str]:
    """Node ids of the fast tier's tests selected by `marks` (a real collection, so the marks
    are the ones pytest sees: derived by tests/conftest.py, a file's `pytestmark`, a test's or a
    parameter's)."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "--ignore", str(TESTS / "stack"), "-m", marks, str(TESTS)],
        cwd=TESTS.parent, capture_output=True, text=True, timeout=600,
        # The listing's format is `-q`'s whatever the run's own options (`-v` would make it a tree).
        env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return {line for line in out.stdout.splitlines() if "::" in line}


def test_the_prerelease_takes_every_fast_test_whose_imports_reach_verifiers() -> None:
    """tests/run.sh runs `-m verifiers_dev` on the verifiers pre-release: a fast test file is in
    it when its imports reach verifiers, through the package (test_taskset.py: the taskset
    module) or directly, with no mark written; one that reaches no verifiers code is not, unless
    marked by hand; and mypy (which reads verifiers' source) is, ruff not."""
    on_ids = _fast_tests("verifiers_dev")
    on = {nodeid.split("::")[0] for nodeid in on_ids}
    off = {nodeid.split("::")[0] for nodeid in _fast_tests("not verifiers_dev")}
    assert {"tests/test_taskset.py", "tests/test_harness.py", "tests/bridge/test_chat.py"} <= on
    assert {"tests/test_util.py", "tests/shared/test_gate.py", "tests/test_net.py"} <= off
    for name in sorted(off - on):
        assert not touches_verifiers(TESTS.parent / name), f"{name} reaches verifiers, unmarked"
    static = "tests/test_static.py::test_static_check_passes"
    assert f"{static}[mypy]" in on_ids and f"{static}[ruff-check]" not in on_ids


IMPORTS = {
    "test_direct": "import verifiers\n\n\ndef test_a():\n    pass\n",
    "test_through_package": (
        "from verifiers_nemogym.taskset import NeMoGymTaskset\n\n\ndef test_b():\n    pass\n"
    ),
    "test_in_a_function": "def test_c():\n    import verifiers\n",
    "test_type_only": (
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import verifiers\n\n\n"
        "def test_d():\n    pass\n"
    ),
}


def test_a_test_file_finds_its_prerelease_tier_by_its_imports(pytester: pytest.Pytester) -> None:
    """On inner sessions with this conftest: what a file imports at its top decides; an import
    inside a test or under TYPE_CHECKING does not."""
    inner_tests(pytester, **IMPORTS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-m", "verifiers_dev", "--collect-only", "-q", timeout=600
    )
    collected = {line.split("::")[0] for line in result.stdout.lines if "::" in line}
    assert collected == {"test_direct.py", "test_through_package.py"}


def test_run_sh_exit_trap_keeps_the_runs_status_when_no_background_job_is_left(
    tmp_path: Path,
) -> None:
    """tests/run.sh ends with `exit "$status"` after every background job was waited for; its
    EXIT trap (run under `set -e`) must then leave that status as it is, and remove the logs."""
    source = (TESTS / "run.sh").read_text()
    trap = re.search(r"^trap '(.+)' EXIT", source, re.MULTILINE)
    assert trap is not None, "tests/run.sh has no EXIT trap"
    logs = tmp_path / "logs"
    logs.mkdir()
    script = (
        "set -euo pipefail\n"
        f"BACKGROUND_LOGS={logs}\n"
        f"trap '{trap.group(1)}' EXIT\n"
        "(true) & wait $!\n"
        'exit "$1"\n'
    )
    for status in (0, 1):
        done = subprocess.run(["bash", "-c", script, "run.sh", str(status)], timeout=60)
        assert done.returncode == status
    assert not logs.exists()


SIGINT_OF_A_CHILD = """import signal, subprocess, sys


def test_a_child_takes_ctrl_c():
    probe = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stdout.strip() == "True", done
"""


def test_a_suite_started_with_sigint_ignored_gives_its_children_ctrl_c(
    pytester: pytest.Pytester,
) -> None:
    """A session started as a script's background job (SIGINT ignored, as tests/run.sh starts
    the pre-release's): the processes its tests start take SIGINT as from a terminal."""
    inner_tests(pytester, test_inner=SIGINT_OF_A_CHILD)
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the inner session
    try:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=600)
    finally:
        signal.signal(signal.SIGINT, ignored)
    result.assert_outcomes(passed=1)
