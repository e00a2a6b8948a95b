"""The tiers (tests/conftest.py), run on inner pytest sessions with this conftest and the
layout of tests/: a test outside stack/ that starts a stack fails before anything is spawned;
under stack/ (marked `stack` by its path, no mark written) the same start goes ahead; a model
server refusing bad input is allowed in the fast tier; a `stack` mark outside stack/ is refused.
And the pre-release selection (tests/run.sh runs the `verifiers_dev` tests on the verifiers
pre-release): every fast test is in it or in a file excluded by name, with the reason."""

from __future__ import annotations

import re
import subprocess
import sys
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


ALL_NEMO = "NeMo Gym's side (runtimes, catalogs, stacks, hosts, Ray): no verifiers code"
NOT_ON_PRERELEASE = {
    # Fast-tier files (under tests/) with tests that tests/run.sh does not run on the verifiers
    # pre-release, and why. Every other fast test is marked `verifiers_dev`.
    "bridge/test_anthropic.py": "the Anthropic dialect of the proxy: the package's code only",
    "bridge/test_bodies.py": "request bodies through the proxy and the relay: no verifiers code",
    "bridge/test_front.py": "the shared stack's front forwarder: no verifiers code",
    "bridge/test_redact.py": "redaction of the proxy's notices: no verifiers code",
    "judge/test_endpoint.py": "the judge endpoint's host secrets: no verifiers code",
    "judge/test_relay.py": "the judge relay and its retries: no verifiers code",
    "nemo/test_catalog_releases.py": ALL_NEMO,
    "shared/test_gate.py": ALL_NEMO,
    "nemo/test_harnesses.py": ALL_NEMO,
    "nemo/test_judges.py": ALL_NEMO,
    "shared/test_protocol.py": ALL_NEMO,
    "nemo/test_ray_cluster.py": ALL_NEMO + " (a taskset option's parsing is test_taskset's)",
    "nemo/test_releases.py": ALL_NEMO + " (the taskset's rows are test_taskset's)",
    "nemo/test_remote.py": ALL_NEMO,
    "nemo/test_runtime_catalog.py": ALL_NEMO,
    "shared/test_host.py": ALL_NEMO,
    "nemo/test_stack_command.py": ALL_NEMO,
    "nemo/test_stack_leftovers.py": ALL_NEMO,
    "nemo/test_stack_start.py": ALL_NEMO,
    "nemo/test_supervisor.py": ALL_NEMO,
    "policies/test_answer_key.py": "a model server of the package: no verifiers code",
    "policies/test_llama_generate.py": "a model server of the package: no verifiers code",
    "policies/test_local_model.py": "a model server of the package: no verifiers code",
    "policies/test_replay.py": "a model server of the package: no verifiers code",
    "policies/test_replay_judge.py": "a model server of the package: no verifiers code",
    "cli/test_list_judges.py": "`list`'s reading of the surveys' data: no verifiers code",
    "containers/test_images.py": "task images and hand-made tasks: no verifiers code",
    "containers/test_sandbox.py": "what configs ask of sandboxes: no verifiers code",
    "containers/test_opensandbox_execd.py": "the stand-in execd, provider config: no verifiers",
    "containers/test_sweep.py": "which stacks the container sweep keeps: no verifiers code",
    "test_util.py": "the package's process helpers: no verifiers code",
    "nemo/test_release_versions.py": ALL_NEMO,
    "policies/test_fixer.py": "a model server of the package: no verifiers code",
    "test_packaging.py": "the wheel's files and declared dependencies: the same on any verifiers",
    "test_bench_args.py": "the benchmarks (benchmarks/): no verifiers code",
    "test_bench_containers.py": "the benchmarks (benchmarks/): no verifiers code",
    "test_bench_children.py": "the benchmarks (benchmarks/): no verifiers code",
    "test_bench_link.py": "the benchmarks (benchmarks/): no verifiers code",
    "test_bench_soak.py": "the benchmarks (benchmarks/): no verifiers code",
    "test_docs.py": "the docs against the code (its options-page test is on the pre-release)",
    "test_docs_names.py": "the docs against the code: the same on any verifiers",
    "test_imports.py": "the package's import graph, read from its source",
    "test_net.py": "the package's HTTP serving: no verifiers code",
    "test_retry.py": "the package's retry policy: no verifiers code",
    "test_static.py": "ruff reads the same source on any verifiers (the mypy case is on it)",
    "test_tiers.py": "the tiers and this selection: the same on any verifiers",
}
VERIFIERS_IMPORT = re.compile(r"^(import|from) (verifiers|renderers|nemo_gym_env)\b", re.MULTILINE)


def _fast_tests(marks: str) -> set[str]:
    """Node ids of the fast tier's tests selected by `marks` (a real collection, so the marks
    are the ones pytest sees: a file's `pytestmark`, a test's or a parameter's)."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "--ignore", str(TESTS / "stack"), "-m", marks, str(TESTS)],
        cwd=TESTS.parent, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return {line for line in out.stdout.splitlines() if "::" in line}


def test_every_fast_test_is_on_the_prerelease_or_in_a_file_excluded_by_name() -> None:
    """tests/run.sh runs `-m verifiers_dev` on the verifiers pre-release: a new fast test runs
    there unless its file is in NOT_ON_PRERELEASE (with the reason), and an excluded file
    imports none of verifiers at its top."""
    left = _fast_tests("not verifiers_dev")
    left_out = {nodeid.split("::")[0].removeprefix("tests/") for nodeid in left}
    unlisted = sorted(left_out - NOT_ON_PRERELEASE.keys())
    assert unlisted == [], f"mark them verifiers_dev or list them in NOT_ON_PRERELEASE: {unlisted}"
    stale = sorted(NOT_ON_PRERELEASE.keys() - left_out)
    assert stale == [], f"in NOT_ON_PRERELEASE but every test of it is marked or gone: {stale}"
    for name in NOT_ON_PRERELEASE:
        imports = VERIFIERS_IMPORT.search((TESTS / name).read_text())
        assert imports is None, f"{name} imports verifiers code: mark it verifiers_dev"
    static = "tests/test_static.py::test_static_check_passes"
    assert f"{static}[mypy]" not in left and f"{static}[ruff-check]" in left


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
