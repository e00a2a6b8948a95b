"""The shared-stack host/lease protocol (`shared/protocol.py`, `shared/client.py`, `shared/host.py`)
with a fake stack in place of NeMo Gym's: the real `attach_or_start`, `StackHost` and lease socket,
with hosts run as tasks of this process (`spawn_host` replaced). That is a unit test of the
protocol: at most one host per stack key whatever is cancelled when, a host removes only its own
socket, nothing outlives its users, and both ends of the socket and the stack folder belong to this
uid. The same with a real stack and a SIGKILLed starter: tests/stack/test_shared_stack.py.

The second-uid tests run a peer under `setpriv` as uid 65534 (nobody), so they need root."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers.processes import until

from verifiers_nemogym.errors import ConfigError, NeMoGymError, StackError
from verifiers_nemogym.nemo import venv as venv_module
from verifiers_nemogym.shared import client, protocol
from verifiers_nemogym.shared import host as host_module
from verifiers_nemogym.shared.host import StackHost
from verifiers_nemogym.shared.protocol import HostSpec

START_S = 0.5
"""How long a fake stack takes to start."""
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # a uid-65534 peer cannot run the venv's (under /root)

as_root = pytest.mark.skipif(
    os.getuid() != 0 or shutil.which("setpriv") is None or not Path(SYSTEM_PYTHON).exists(),
    reason="needs root, setpriv and /usr/bin/python3 to run a peer as a second uid",
)


class FakeStack:
    """Stands in for `NeMoGymStack` inside the host: starts in START_S, never dies."""

    ids = itertools.count(1)
    began: asyncio.Event
    """Set when a fake stack starts (a fresh event per test, see the `hosts` fixture)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.marker = f"host{next(self.ids)}"
        self.agents: dict[str, str] = {}
        self.run_urls: dict[str, str] = {}
        self.head_url = "http://127.0.0.1:1"
        self.relay = None  # no judge

    async def start(self) -> None:
        self.began.set()
        await asyncio.sleep(START_S)
        self.agents = {"agent": "http://127.0.0.1:1"}
        self.run_urls = dict(self.agents)

    async def check_alive(self) -> None:
        pass

    async def stop(self) -> None:
        pass


VENV: Any = SimpleNamespace(
    nemo_gym_version="0.4.0",
    python_version="3.12.0",
    venv=Path("/nonexistent/venv"),
    python=Path("/nonexistent/venv/bin/python"),
    below_floor=False,
)


class InProcessHost:
    """What the fake `spawn_host` returns: a `Popen` look-alike whose host is a task here."""

    def __init__(
        self, directory: Path, spec: HostSpec, lock: Any, hosts: list[InProcessHost]
    ) -> None:
        # A copy of the spawner's flocked file, as a child process inherits it.
        self.host = StackHost(VENV, directory, spec, os.fdopen(os.dup(lock.fileno()), "a"))
        self.task = asyncio.get_running_loop().create_task(self.host.run())
        self.pid = os.getpid()
        hosts.append(self)

    def poll(self) -> int | None:
        if not self.task.done():
            return None
        return 1 if self.task.cancelled() or self.task.exception() else 0

    def send_signal(self, sig: int) -> None:
        self.task.cancel()

    def wait(self, timeout: float | None = None) -> int | None:
        return self.poll()


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private cache with a short path (a unix socket path must stay under 108 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="vfh"))
    monkeypatch.setenv("VF_NEMOGYM_CACHE", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def configs(cache: Path) -> list[Path]:
    path = cache / "env.yaml"
    path.write_text("fake: {}\n")
    return [path]


@pytest.fixture
async def hosts(monkeypatch: pytest.MonkeyPatch, cache: Path) -> AsyncIterator[list[InProcessHost]]:
    """Every host the test's users spawn (in-process, fake stack); all stopped at the end."""
    spawned: list[InProcessHost] = []
    monkeypatch.setattr(host_module, "NeMoGymStack", FakeStack)
    monkeypatch.setattr(FakeStack, "began", asyncio.Event(), raising=False)
    monkeypatch.setattr(
        client, "spawn_host", lambda d, s, lock, *_: InProcessHost(d, s, lock, spawned)
    )
    yield spawned
    for proc in spawned:
        proc.task.cancel()
    await asyncio.gather(*(p.task for p in spawned), return_exceptions=True)


def running(hosts: list[InProcessHost]) -> list[InProcessHost]:
    return [h for h in hosts if not h.task.done()]


@contextlib.asynccontextmanager
async def most_running(hosts: list[InProcessHost]) -> AsyncIterator[list[int]]:
    """Samples, every 10 ms, how many hosts run; yields the list of samples."""
    samples: list[int] = []

    async def sample() -> None:
        while True:
            samples.append(len(running(hosts)))
            await asyncio.sleep(0.01)

    task = asyncio.create_task(sample())
    try:
        yield samples
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def join(configs: list[Path], idle: float = 0.3, who: str = "u") -> client.Lease:
    return await client.attach_or_start(
        VENV,
        configs,
        proxy_url="http://127.0.0.1:9",
        proxy_secret=f"secret-of-{who}",
        idle_timeout=idle,
        start_timeout=30,
    )


def directory_of(configs: list[Path]) -> Path:
    return client.stack_dir(client.stack_key(VENV, configs))


def made_directory(configs: list[Path]) -> Path:
    """The stack folder, created private (as a user's attach would)."""
    directory = directory_of(configs)
    directory.mkdir(parents=True, mode=0o700)
    return directory


# ------------------------------------------------------------------------------ H4


async def test_cancelled_starter_never_leads_to_two_hosts(
    hosts: list[InProcessHost], configs: list[Path]
):
    async with most_running(hosts) as samples:
        a = asyncio.create_task(join(configs, who="A"))
        await asyncio.wait_for(FakeStack.began.wait(), 10)  # A's host is starting its stack
        b = asyncio.create_task(join(configs, who="B"))
        await asyncio.sleep(0)  # B asks for the stack lock, which A holds
        assert hosts and not running(hosts)[0].host.claimed  # its fake stack takes START_S
        a.cancel()  # mid-start of the host A spawned; B is waiting on the stack lock
        lease_b = await asyncio.wait_for(b, 10)
        assert lease_b.marker == hosts[0].host.stack.marker  # A's host, not a second one
        assert not lease_b.started
        await lease_b.close()
        await until(lambda: not running(hosts), 5, "host1 stops after its last user")
        lease_c = await join(configs, who="C")  # a new generation, once host1 is gone
        assert lease_c.started and len(hosts) == 2
        await lease_c.close()
        await until(lambda: not running(hosts), 5, "host2 stops after its last user")
    assert max(samples) == 1, f"hosts running at once: {max(samples)}"


async def test_users_that_see_different_stacks_folders_never_share_a_host(
    hosts: list[InProcessHost], configs: list[Path], cache: Path, monkeypatch: pytest.MonkeyPatch
):
    """`VF_NEMOGYM_STACKS` moves the stacks' folders: the same stack key under two of them is
    two hosts, and `stack status` sees the hosts of its own folder only."""
    monkeypatch.setenv(client.STACKS_ENV_VAR, str(cache / "a"))
    first = await join(configs, who="A")
    same = await join(configs, who="B")
    assert directory_of(configs).parent == cache / "a"
    monkeypatch.setenv(client.STACKS_ENV_VAR, str(cache / "b"))
    other = await join(configs, who="C")
    assert directory_of(configs).parent == cache / "b"
    assert same.marker == first.marker and not same.started
    assert other.started and other.marker != first.marker and len(running(hosts)) == 2
    assert [info.directory.parent for info in await client.list_hosts()] == [cache / "b"]
    for user in (first, same, other):
        await user.close()
    await until(lambda: not running(hosts), 5, "both hosts stop after their last user")


async def test_slow_host_is_waited_for_not_replaced(
    hosts: list[InProcessHost], configs: list[Path], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(client, "LEASE_ANSWER_TIMEOUT", 0.3)
    serve = StackHost._serve
    connections = itertools.count()

    async def slow_serve(self: StackHost, reader: Any, writer: Any) -> None:
        if next(connections) in (1, 2):  # B's first two hellos: answered after B gave up
            await asyncio.sleep(1.0)
        await serve(self, reader, writer)

    monkeypatch.setattr(StackHost, "_serve", slow_serve)
    first = await join(configs, who="A")
    async with most_running(hosts) as samples:
        second = await asyncio.wait_for(join(configs, who="B"), 15)
    assert second.marker == first.marker and not second.started and len(hosts) == 1
    assert max(samples) == 1
    await first.close()
    await second.close()


async def test_host_never_unlinks_a_socket_it_did_not_bind(
    hosts: list[InProcessHost], configs: list[Path]
):
    held = await join(configs)
    (proc,) = hosts
    path = held.directory / protocol.SOCKET
    # Another socket now sits at the path (as a second host's would).
    path.unlink()
    other = await asyncio.start_unix_server(lambda r, w: w.close(), path=str(path))
    other_inode = path.stat().st_ino
    try:
        await held.close()
        await until(lambda: proc.task.done(), 5, "the idle host exits")
        assert path.exists() and path.stat().st_ino == other_inode
    finally:
        other.close()


async def test_host_refuses_to_bind_over_an_answering_socket(
    hosts: list[InProcessHost], configs: list[Path]
):
    directory = made_directory(configs)
    path = directory / protocol.SOCKET
    other = await asyncio.start_unix_server(lambda r, w: w.close(), path=str(path))
    inode = path.stat().st_ino
    spec = client.host_spec(VENV, configs, 0.3, 30)
    try:
        with pytest.raises(StackError, match="answers on"):
            await StackHost(VENV, directory, spec).run()
        assert path.stat().st_ino == inode
    finally:
        other.close()


async def test_second_host_for_a_key_exits_without_starting(
    hosts: list[InProcessHost], configs: list[Path], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(host_module, "HOST_LOCK_WAIT", 0.3, raising=False)
    held = await join(configs)
    spec = client.host_spec(VENV, configs, 0.3, 30)
    second = StackHost(VENV, held.directory, spec)
    with pytest.raises(StackError, match="another stack host"):
        await second.run()
    assert second.stack is None  # nothing started
    await held.close()


async def test_unclaimed_host_stops_by_itself(
    hosts: list[InProcessHost], configs: list[Path], monkeypatch: pytest.MonkeyPatch
):
    """A persistent (`stack up`) host whose starter was cancelled before it claimed it."""
    monkeypatch.setattr(protocol, "UNCLAIMED_GRACE", 0.5)
    directory = made_directory(configs)
    spec = client.host_spec(VENV, configs, None, 30, persistent=True)
    await asyncio.wait_for(StackHost(VENV, directory, spec).run(), START_S + 5)
    assert not (directory / protocol.SOCKET).exists()


async def test_lease_close_ends_the_lease_while_a_forked_copy_holds_the_socket(
    hosts: list[InProcessHost], configs: list[Path]
):
    held = await join(configs, idle=30)
    (proc,) = hosts
    copy = os.dup(held._writer.get_extra_info("socket").fileno())  # as a forked child has
    try:
        await held.close()
        await until(lambda: not proc.host.leases, 3, "the host sees the user leave")
    finally:
        os.close(copy)


async def test_host_drops_a_connection_that_says_nothing(
    hosts: list[InProcessHost], configs: list[Path], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(host_module, "FIRST_MESSAGE_TIMEOUT", 0.3, raising=False)
    held = await join(configs, idle=30)
    reader, writer = await asyncio.open_unix_connection(held.directory / protocol.SOCKET)
    try:
        assert await asyncio.wait_for(reader.read(), 3) == b""
    finally:
        writer.close()
        await held.close()


@pytest.mark.parametrize("timeout", ["nan", "inf", -1, "soon", True])
async def test_persist_refuses_a_bad_idle_timeout(
    hosts: list[InProcessHost], configs: list[Path], timeout: object
):
    held = await join(configs, idle=30)
    answer = await protocol.request(held.directory, {"op": "persist", "idle_timeout": timeout})
    assert answer["ok"] is False and "idle timeout" in answer["error"]
    (proc,) = hosts
    assert (proc.host.spec.idle_timeout, proc.host.spec.persistent) == (30, False)
    await held.close()


async def test_status_and_down_find_a_host_that_does_not_answer(cache: Path, configs: list[Path]):
    directory = made_directory(configs)
    argv = ["-m", host_module.__name__, "--dir", str(directory)]  # a host's command line
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", *argv],
        env={**os.environ, protocol.HOST_ENV_VAR: directory.name},
    )
    try:
        await until(lambda: proc.pid in client.host_processes().values(), 5, "scan finds it")
        (info,) = await client.list_hosts()
        assert (info.directory, info.pid, info.status) == (directory, proc.pid, None)
        assert await client.take_down(directory, timeout=5, pid=info.pid) == proc.pid
        assert proc.wait(5) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


async def test_socket_path_too_long_is_refused_before_anything_starts(
    hosts: list[InProcessHost], monkeypatch: pytest.MonkeyPatch, cache: Path
):
    deep = cache / ("d" * 90)
    deep.mkdir(mode=0o700)
    monkeypatch.setenv("VF_NEMOGYM_CACHE", str(deep))
    config = cache / "env.yaml"
    config.write_text("fake: {}\n")
    with pytest.raises(StackError, match="longer than 107 bytes") as caught:
        await join([config])
    assert "\n" not in str(caught.value) and hosts == []


# ------------------------------------------------------------------------------ H1


@contextlib.asynccontextmanager
async def recording_host(path: Path) -> AsyncIterator[list[bytes]]:
    """A fake host of this uid at `path` that records what users send it."""
    got: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got.append(await reader.readline())
        writer.close()

    server = await asyncio.start_unix_server(serve, path=str(path))
    try:
        yield got
    finally:
        server.close()


@pytest.mark.parametrize("folder", ["stack", "cache root"])
async def test_open_stack_folder_is_refused_before_any_hello(
    hosts: list[InProcessHost], configs: list[Path], cache: Path, folder: str
):
    directory = directory_of(configs)
    directory.mkdir(parents=True)
    async with recording_host(directory / protocol.SOCKET) as got:
        (directory if folder == "stack" else cache).chmod(0o777)
        with pytest.raises(ConfigError, match=r"writable.*VF_NEMOGYM_CACHE") as caught:
            await join(configs)
        await asyncio.sleep(0.2)
    assert got == [] and hosts == [] and "\n" not in str(caught.value)


@as_root
async def test_stack_folder_of_another_uid_is_refused_before_any_hello(
    hosts: list[InProcessHost], configs: list[Path]
):
    directory = directory_of(configs)
    directory.mkdir(parents=True, mode=0o700)
    async with recording_host(directory / protocol.SOCKET) as got:
        os.chown(directory, NOBODY, NOBODY)
        with pytest.raises(ConfigError, match=f"owned by uid {NOBODY}"):
            await join(configs)
        await asyncio.sleep(0.2)
    assert got == [] and hosts == []


async def test_runtime_folders_others_can_write_are_refused(
    cache: Path, monkeypatch: pytest.MonkeyPatch
):
    def build(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a runtime would be built in an unchecked folder")

    monkeypatch.setattr(venv_module, "_create", build)
    for name in ("runtimes", "server-venvs"):
        (cache / name).mkdir(mode=0o700, exist_ok=True)
        (cache / name).chmod(0o775)
        with pytest.raises(ConfigError, match=f"{name} is group- or world-writable"):
            venv_module.ensure_venv("0.4.0")
        (cache / name).chmod(0o700)


def as_nobody(*args: str) -> list[str]:
    return [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        SYSTEM_PYTHON,
        "-I",
        *args,
    ]


FAKE_HOST = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o777); s.listen()
print("ready", flush=True)
while True:
    c, _ = s.accept(); c.settimeout(2)
    try:
        data = c.recv(65536)
    except OSError:
        data = b""
    print("hello" if data else "silent", flush=True)
    c.close()
"""


@as_root
async def test_lease_refuses_a_host_of_another_uid(
    hosts: list[InProcessHost], configs: list[Path], cache: Path
):
    directory = made_directory(configs)
    for folder in (cache, directory.parent):
        folder.chmod(0o755)  # nobody can reach the stack folder...
    directory.chmod(0o777)  # ...and, for the moment, bind in it
    path = directory / protocol.SOCKET
    fake = await asyncio.create_subprocess_exec(
        *as_nobody("-c", FAKE_HOST, str(path)), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert fake.stdout is not None
        assert await asyncio.wait_for(fake.stdout.readline(), 10) == b"ready\n"
        directory.chmod(0o700)  # private again: only the listener's uid is wrong
        with pytest.raises(StackError, match=f"served by uid {NOBODY}") as caught:
            await join(configs)
        with pytest.raises(StackError, match=f"served by uid {NOBODY}"):
            await protocol.request(directory, {"op": "status"})
        assert "\n" not in str(caught.value) and hosts == []
    finally:
        fake.kill()
        out, _ = await fake.communicate()
    assert b"hello" not in out


NOSY_USER = """
import json, socket, sys
c = socket.socket(socket.AF_UNIX); c.settimeout(5); c.connect(sys.argv[1])
try:
    c.sendall(b'{"op": "status"}\\n')
    answer = c.recv(65536).decode()
except OSError:  # reset or broken pipe: the host closed on us
    answer = ""
print(json.dumps(answer))
"""


@as_root
async def test_host_refuses_a_user_of_another_uid(
    hosts: list[InProcessHost], configs: list[Path], cache: Path
):
    held = await join(configs, idle=30)
    path = held.directory / protocol.SOCKET
    for folder in (cache, held.directory.parent, held.directory):
        folder.chmod(0o711)  # the socket reachable by nobody: only the uid check is left
    path.chmod(0o777)
    try:
        nosy = await asyncio.create_subprocess_exec(
            *as_nobody("-c", NOSY_USER, str(path)), stdout=asyncio.subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(nosy.communicate(), 10)
        assert json.loads(out) == ""  # closed without an answer
    finally:
        await held.close()


def test_private_dir_refuses_a_symlink(tmp_path: Path):
    from verifiers_nemogym.util import private_dir

    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(NeMoGymError, match="not a folder"):
        private_dir(tmp_path / "link")


async def test_lock_and_log_symlinks_are_not_followed(
    hosts: list[InProcessHost], configs: list[Path], cache: Path
):
    directory = made_directory(configs)
    victim = cache / "victim"
    victim.write_text("untouched")
    (directory / "lock").symlink_to(victim)
    with pytest.raises(StackError, match="cannot open the shared stack lock"):
        await join(configs)
    (directory / "lock").unlink()
    (directory / "host.log").symlink_to(victim)
    with pytest.raises(OSError):
        client.open_nofollow(directory / "host.log")
    assert victim.read_text() == "untouched"


@pytest.mark.parametrize("name", ["releases", "models", "tokenizers"])
def test_other_cache_folders_others_can_write_are_refused(cache: Path, name: str) -> None:
    """Release files (configs NeMo Gym runs), the local model and its tokenizer: planted ones
    would run as you, so an open folder is refused before anything is read from it."""
    from verifiers_nemogym.nemo.release import release_files
    from verifiers_nemogym.policies.gguf_tokenizer import tokenizer_dir
    from verifiers_nemogym.policies.local_model import packaged_model_path

    use = {
        "releases": lambda: release_files("0.4.0"),
        "models": packaged_model_path,
        "tokenizers": lambda: tokenizer_dir(cache / "model.gguf"),
    }[name]
    (cache / name).mkdir(mode=0o700, exist_ok=True)
    (cache / name).chmod(0o777)
    with pytest.raises(ConfigError, match=f"{name} is group- or world-writable"):
        use()


def test_sandbox_packages_are_part_of_a_stacks_identity(configs: list[Path], tmp_path: Path):
    """A user asking for other sandbox packages (or a rebuilt wheel at the same path) never
    attaches to a stack whose sandbox servers have another set; none keeps the old key."""
    wheel = tmp_path / "p-0.1-py3-none-any.whl"
    wheel.write_bytes(b"one")
    plain = client.stack_key(VENV, configs)
    assert client.stack_key(VENV, configs, sandbox_packages=()) == plain
    with_wheel = client.stack_key(VENV, configs, sandbox_packages=[str(wheel)])
    assert with_wheel != plain
    assert client.stack_key(VENV, configs, sandbox_packages=[str(wheel)]) == with_wheel
    wheel.write_bytes(b"two")
    assert client.stack_key(VENV, configs, sandbox_packages=[str(wheel)]) not in (plain, with_wheel)
