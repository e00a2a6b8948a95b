"""The tiers (tests/conftest.py), run on inner pytest sessions with this conftest and the
layout of tests/: a test outside stack/ that starts a stack fails before anything is spawned;
under stack/ (marked `stack` by its path, no mark written) the same start goes ahead; a model
server refusing bad input is allowed in the fast tier; a `stack` mark outside stack/ is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    """pytester's folder as tests/: this conftest and helpers, and `files` (name -> source)."""
    pytester.makeini(INI)
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.makepyfile(helpers=(TESTS / "helpers.py").read_text())
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
