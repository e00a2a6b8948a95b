"""Shared fixtures, the slow tier by folder, and the guard of the fast tier.

Tiers: every test under tests/stack/ (one that starts a NeMo Gym stack, a model server, an
install or NeMo Gym's config resolver) is marked `stack` by its path, here, and no test
elsewhere may carry that mark; `pytest -m "not stack"` runs the rest in a few minutes (given
the cached NeMo Gym runtime venvs, and two workers, `-n 2 --dist loadfile`, as tests/run.sh runs
it). A test outside tests/stack/ that starts a stack or a local model server fails (see
`launches`), and the session fails if a stack or model process it started outlives it.

The verifiers pre-release (tests/run.sh) runs the tests marked `verifiers_dev`: every fast test
whose file touches verifiers by what it imports at its top, through the package and helpers
(`touches_verifiers`), marked here; a test marked by hand is the exception, with its reason.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.processes import SESSION_VAR, Launches, launched_processes, wait_gone
from helpers.stacks import VERSIONS
from tiering import touches_verifiers

from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.stack import NeMoGymStack
from verifiers_nemogym.nemo.venv import NeMoGymVenv, ensure_venv
from verifiers_nemogym.policies.local_model import LocalModelServer
from verifiers_nemogym.policies.scripted import ScriptedPolicy

pytest_plugins = ["pytester"]  # tests/test_tiers.py runs inner sessions with this conftest

STACK_TIER = Path(__file__).parent / "stack"
"""The slow tier: every test collected under this folder is marked `stack`."""


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as from a terminal for every process the tests start: a suite run as a script's
    background job (tests/run.sh runs the pre-release's tests so) starts with SIGINT ignored,
    which its children inherit across exec (Python then installs no handler of its own), and a
    test stopping one with SIGINT would find it deaf."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_report_header(config: pytest.Config) -> str:
    """The log says whether the tests that need root ran: network namespaces
    (tests/stack/test_across_hosts.py, tests/stack/test_ray_cluster.py), a peer of a second uid
    (tests/shared/test_host.py) and the next PID chosen (tests/nemo/test_supervisor.py)
    skip for any other user."""
    if os.geteuid() == 0:
        return "running as root: yes (the tests that need root run)"
    return f"running as root: no (uid {os.geteuid()}): the tests that need root skip"


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test under tests/stack/ `stack`, and each fast test whose file touches verifiers
    `verifiers_dev`; a test elsewhere marked `stack` by hand is a usage error (the slow tier is
    the folder, so that no mark has to be remembered)."""
    astray = []
    for item in items:
        if item.path.is_relative_to(STACK_TIER):
            item.add_marker(pytest.mark.stack)
            continue
        if touches_verifiers(item.path):
            item.add_marker(pytest.mark.verifiers_dev)
        if item.get_closest_marker("stack") is not None:
            astray.append(item.nodeid)
    if astray:
        raise pytest.UsageError(
            f"marked `stack` outside tests/stack/ (move them there instead): {', '.join(astray)}"
        )


@pytest.fixture(scope="session", autouse=True)
def session_tag() -> Iterator[str]:
    """`VF_NEMOGYM_TEST_SESSION=<hex>`, inherited by everything this session starts; at the
    end nothing it started as a stack or model server may be left (waited for, bounded)."""
    value = uuid.uuid4().hex
    os.environ[SESSION_VAR] = value
    entry = f"{SESSION_VAR}={value}"
    yield entry
    left = launched_processes(entry)
    assert wait_gone(left, 60), f"stack or model processes outlived the tests: {left}"


MOVE = "move it under tests/stack/, whose tests are marked `stack` by their path"


@pytest.fixture(autouse=True)
def launches(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Launches:
    """Records every `NeMoGymStack.start` and `LocalModelServer.start` of the test. In a test
    not marked `stack` (not under tests/stack/), a stack start fails the test before anything is
    spawned, and a model server that comes up is stopped and fails it (a start refusing bad input
    is fine there)."""
    seen = Launches()
    fast = request.node.get_closest_marker("stack") is None  # set by the path, above
    stack_start = NeMoGymStack.start
    model_start = LocalModelServer.start

    async def start_stack(self: NeMoGymStack) -> None:
        seen.stacks.append(self.marker)
        if fast:
            pytest.fail(f"this test starts a NeMo Gym stack: {MOVE}")
        await stack_start(self)

    def start_model(self: LocalModelServer) -> LocalModelServer:
        seen.models.append(self.marker)
        server = model_start(self)  # bad input raises before a server is spawned: allowed
        if fast:
            server.stop()
            pytest.fail(f"this test starts a model server: {MOVE}")
        return server

    monkeypatch.setattr(NeMoGymStack, "start", start_stack)
    monkeypatch.setattr(LocalModelServer, "start", start_model)
    return seen


@pytest.fixture(scope="session")
def nemo_venv() -> NeMoGymVenv:
    """The NeMo Gym 0.4.0 runtime venv; the first test run creates it (about a minute)."""
    return ensure_venv()


@pytest.fixture(scope="module", params=VERSIONS)
def any_nemo_venv(request: pytest.FixtureRequest) -> NeMoGymVenv:
    """Each NeMo Gym version the stack tests cover, in turn (module scope: one at a time)."""
    if request.param == "0.4.0":
        return ensure_venv("0.4.0")
    return ensure_venv("0.7.0", allow_below_floor=True)


@pytest.fixture(scope="session")
def catalog(nemo_venv: NeMoGymVenv) -> Catalog:
    """NeMo Gym's environments, as installed in the runtime venv."""
    return Catalog(nemo_venv)


@pytest.fixture
async def policy() -> AsyncIterator[ScriptedPolicy]:
    """The scripted model on 127.0.0.1 (a `[fault:hang]` call waits 120 s)."""
    async with ScriptedPolicy(hang_seconds=120) as p:
        yield p


class SecretWatch:
    """Collects the secrets of a running nemo-gym-env (the proxy's, and every rollout's bearer
    secret as its route opens) so a test can check that none reached a trace, log or error.
    It only observes: `open_route` still runs unchanged."""

    def __init__(self) -> None:
        self.secrets: set[str] = set()

    def watch(self, env: Any) -> None:
        """Start watching `env`, inside its `serving()` block."""
        proxy = env.taskset.config.task._live.proxy
        self.secrets.add(proxy.secret)
        original = proxy.open_route

        def open_route(endpoint: str, secret: str, *args: Any, **kwargs: Any) -> Any:
            self.secrets.add(secret)
            return original(endpoint, secret, *args, **kwargs)

        proxy.open_route = open_route

    def assert_absent(self, texts: dict[str, str]) -> None:
        """No watched secret occurs in any of `texts` (name -> text)."""
        assert len(self.secrets) > 1, "no rollout was watched"
        for name, text in texts.items():
            for secret in self.secrets:
                assert secret not in text, f"a secret leaked into {name}"


@pytest.fixture
def secret_watch() -> SecretWatch:
    return SecretWatch()


@pytest.fixture(scope="session")
def nemo_venv_07() -> NeMoGymVenv:
    """The NeMo Gym 0.7.0 runtime, built with the below-floor opt-in (no Python >= 3.13.14
    here; 0.7.0 declares that CPython security floor). A few seconds from a warm uv cache."""
    return ensure_venv("0.7.0", allow_below_floor=True)
