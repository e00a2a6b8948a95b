"""The pieces of a stack used across hosts, on loopback and without NeMo Gym (the two-host
test with a real stack is tests/stack/test_across_hosts.py): the certificate, pin and token
files (`shared/tls.py`), the gate's refusals (`shared/gate.py`), the one-line errors of a client
(`shared/gate_client.py`) with a wrong pin, a wrong or missing token or a bad `--listen`, and
model calls riding a lease back to the env process's real proxy (the model is the scripted
policy)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from helpers.processes import until

from verifiers_nemogym.bridge.front import FrontForwarder
from verifiers_nemogym.bridge.proxy import NeMoGymModelProxy
from verifiers_nemogym.bridge.wire import route_metadata
from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.net import free_port
from verifiers_nemogym.policies.scripted import ScriptedPolicy
from verifiers_nemogym.shared import protocol, tls
from verifiers_nemogym.shared.gate import StackGate
from verifiers_nemogym.shared.gate_client import GateLink, GateTarget, describe_gate

COMMAND = str(Path(sys.executable).with_name("nemo-gym-env"))


def test_certificate_and_token_files(tmp_path: Path) -> None:
    pin = tls.make_certificate(tmp_path, "127.0.0.1")
    der = ssl.PEM_cert_to_DER_cert((tmp_path / tls.CERT_FILE).read_text())
    assert (
        pin == tls.format_pin(der)
        and tls.parse_pin(pin) == __import__("hashlib").sha256(der).digest()
    )
    assert stat.S_IMODE((tmp_path / tls.KEY_FILE).stat().st_mode) == 0o600
    token = tls.write_token(tmp_path / tls.TOKEN_FILE)
    assert stat.S_IMODE((tmp_path / tls.TOKEN_FILE).stat().st_mode) == 0o600
    assert len(token) >= 40 and tls.read_token(tmp_path / tls.TOKEN_FILE) == token
    # A second start makes another certificate: the old pin no longer matches.
    assert tls.make_certificate(tmp_path, "127.0.0.1") != pin
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [tls.CERT_FILE, tls.KEY_FILE, tls.TOKEN_FILE]
    )  # no temporary file left


@pytest.mark.parametrize(
    "text", ["8443", "localhost:8443", "10.0.0.5", "10.0.0.5:0", "10.0.0.5:99999", "[::1]:x"]
)
def test_bad_listen_is_one_line(text: str) -> None:
    with pytest.raises(ConfigError) as e:
        tls.parse_listen(text)
    assert "\n" not in str(e.value) and "HOST:PORT" in str(e.value)


def test_listen_forms() -> None:
    assert tls.parse_listen("10.0.0.5:8443") == ("10.0.0.5", 8443)
    assert tls.parse_listen("[::1]:8443") == ("::1", 8443)


@pytest.mark.parametrize("pin", ["", "sha256:abc", "md5:" + "0" * 64, "0" * 64])
def test_bad_pin_is_one_line(pin: str) -> None:
    with pytest.raises(ConfigError, match="sha256:<64 hex digits>"):
        tls.parse_pin(pin)


def test_token_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tls.TOKEN_ENV_VAR, raising=False)
    with pytest.raises(ConfigError, match="stack-token-file FILE or set VF_NEMOGYM_STACK_TOKEN"):
        tls.read_token(None)
    with pytest.raises(ConfigError, match="cannot read it"):
        tls.read_token(tmp_path / "missing")
    (tmp_path / "shared").write_text("t" * 43)
    (tmp_path / "shared").chmod(0o644)
    with pytest.raises(ConfigError, match=r"readable or writable by other users \(mode 644\)"):
        tls.read_token(tmp_path / "shared")
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "empty").chmod(0o600)
    with pytest.raises(ConfigError, match="is empty"):
        tls.read_token(tmp_path / "empty")
    monkeypatch.setenv(tls.TOKEN_ENV_VAR, "t" * 43)
    assert tls.read_token(None) == "t" * 43


def test_stack_up_with_a_bad_listen_is_one_line_and_starts_nothing() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for listen, expected in (
            ("gpu-node:8443", "is not HOST:PORT with HOST an IP address"),
            (f"127.0.0.1:{port}", f"--listen 127.0.0.1:{port}: cannot listen"),
            ("192.0.2.1:8443", "cannot listen (Cannot assign requested address)"),
        ):
            run = subprocess.run(
                [COMMAND, "stack", "up", "example_single_tool_call", "--listen", listen],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert run.returncode == 2 and run.stdout == "", run
            (line,) = run.stderr.strip().splitlines()
            assert expected in line, line


class Gate:
    """A gate on loopback in front of a real front forwarder; its only "agent" is the
    scripted policy (an HTTP server to forward to)."""

    def __init__(self, directory: Path, policy: ScriptedPolicy) -> None:
        self.front = FrontForwarder()
        self.changes = 0

        def changed() -> None:
            self.changes += 1

        self.gate = StackGate(
            "127.0.0.1", 0, directory=directory, front=self.front,
            run_urls={"agent": policy.url}, on_users=changed,
            describe=lambda: {"pid": 1, "agents": ["agent"], "judge": None},
        )  # fmt: skip

    @property
    def token(self) -> str:
        return self.gate.token_file.read_text().strip()


@pytest.fixture
async def gate(tmp_path: Path) -> AsyncIterator[tuple[Gate, ScriptedPolicy]]:
    async with ScriptedPolicy() as policy:
        made = Gate(tmp_path, policy)
        await made.front.start()
        await made.gate.start()
        try:
            yield made, policy
        finally:
            await made.gate.stop()
            await made.front.stop()


async def _one_line(coro: Any, kind: type[Exception]) -> str:
    with pytest.raises(kind) as e:
        await coro
    assert "\n" not in str(e.value)
    return str(e.value)


async def test_describe_gate_errors(
    gate: tuple[Gate, ScriptedPolicy], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made, _ = gate
    monkeypatch.delenv(tls.TOKEN_ENV_VAR, raising=False)
    url, pin = made.gate.url, made.gate.pin
    token_file = made.gate.token_file
    target = await describe_gate(url, pin, token_file)
    assert target.agents == ["agent"] and target.run_urls == {"agent": f"{url}/agents/agent"}
    assert made.token not in repr(target)
    other = "sha256:" + "ab" * 32
    text = await _one_line(describe_gate(url, other, token_file), ConfigError)
    assert f"presented the certificate {pin}, not the pinned {other}" in text
    wrong = tmp_path / "wrong-token"
    wrong.write_text("w" * 43)
    wrong.chmod(0o600)
    text = await _one_line(describe_gate(url, pin, wrong), ConfigError)
    assert "refused the access token" in text
    text = await _one_line(describe_gate(url, pin, None), ConfigError)
    assert "needs its access token" in text
    monkeypatch.setenv(tls.TOKEN_ENV_VAR, made.token)
    assert (await describe_gate(url, pin, None)).agents == ["agent"]
    text = await _one_line(describe_gate(f"https://127.0.0.1:{free_port()}", pin, None), StackError)
    assert "is unreachable" in text
    for bad in (url.replace("https", "http"), f"{url}/path", "https://u:p@127.0.0.1:1"):
        text = await _one_line(describe_gate(bad, pin, None), ConfigError)
        assert "u:p" not in text and made.token not in text


async def test_no_token_no_answer_and_no_body_read(gate: tuple[Gate, ScriptedPolicy]) -> None:
    """Every path, every method, a wrong token: 401 and nothing about the stack; a huge body
    announced without a token is refused before a byte of it is sent."""
    made, _ = gate
    pinned = tls.client_ssl(made.gate.pin)
    async with aiohttp.ClientSession() as http:
        for method, path, headers in (
            ("GET", "/stack", {}),
            ("GET", "/lease", {}),
            ("POST", "/agents/agent/run", {}),
            ("GET", "/nothing", {}),
            ("GET", "/stack", {"Authorization": "Bearer " + "x" * 43}),
            ("GET", "/stack", {"Authorization": "Bearer " + made.token[:-1]}),
        ):
            async with http.request(
                method, made.gate.url + path, headers=headers, ssl=pinned
            ) as response:
                body = await response.text()
            assert response.status == 401 and "agent" not in body, (path, body)
    host, port = "127.0.0.1", made.gate.port
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    reader, writer = await asyncio.open_connection(host, port, ssl=context)
    writer.write(
        b"POST /agents/agent/run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000000000\r\n\r\n"
    )
    await writer.drain()
    status = await asyncio.wait_for(reader.readline(), 10)  # no body sent at all
    assert status.startswith(b"HTTP/1.1 401"), status
    writer.close()


async def _target(made: Gate, monkeypatch: pytest.MonkeyPatch) -> GateTarget:
    """The stack behind `made`'s gate, described with the token taken from the environment."""
    monkeypatch.setenv(tls.TOKEN_ENV_VAR, made.token)
    return await describe_gate(made.gate.url, made.gate.pin, None)


@contextlib.asynccontextmanager
async def _lease(target: GateTarget, proxy: NeMoGymModelProxy) -> AsyncIterator[GateLink]:
    """`proxy`'s `GateLink` to `target`: opened (leased) for the block, closed after it however
    it ends."""
    link = GateLink(target, proxy.url, proxy.secret)
    await link.open()
    try:
        yield link
    finally:
        await link.close()


async def test_model_calls_ride_the_lease_back_to_the_proxy(
    gate: tuple[Gate, ScriptedPolicy], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call NeMo Gym's agent makes to the front reaches the env process's loopback proxy
    over the lease and is answered; `/agents/...` reaches the stack's server; once the lease
    is closed, the front no longer knows the secret."""
    made, policy = gate
    target = await _target(made, monkeypatch)
    async with NeMoGymModelProxy() as proxy:
        async with _lease(target, proxy):
            assert len(made.gate.users) == 1 and len(made.front.users) == 1
            route = proxy.open_route(policy.base_url, "bearer")
            body = {
                "model": "m",
                "input": [{"role": "user", "content": "hi"}],
                "metadata": route_metadata(route.id, proxy.secret),
            }
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{made.front.url}/v1/responses", json=body) as response:
                    assert response.status == 200, await response.text()
                assert route.calls == 1 and len(policy.calls) == 1
                # The rollout's own path credential works the same way.
                rollout = f"{made.front.url}/ng-rollout/{route.rollout_id}/v1/responses"
                async with http.post(rollout, json={**body, "metadata": {}}) as response:
                    assert response.status == 200, await response.text()
                assert route.calls == 2
            async with target.client_session() as gate_http:
                forwarded = {"model": "m", "input": [{"role": "user", "content": "hello"}]}
                async with gate_http.post(
                    target.run_urls["agent"] + "/v1/responses", json=forwarded
                ) as response:
                    assert response.status == 200
                assert len(policy.calls) == 3  # through the gate to the stack's server
        await asyncio.sleep(0.2)
        assert made.gate.users == {} and made.front.users == {}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{made.front.url}/v1/responses", json=body) as response,
        ):
            assert response.status == 401


async def test_a_link_is_lost_only_when_the_host_goes_down_or_stops_listening(
    gate: tuple[Gate, ScriptedPolicy], monkeypatch: pytest.MonkeyPatch
) -> None:
    made, _ = gate
    target = await _target(made, monkeypatch)
    async with NeMoGymModelProxy() as proxy:
        async with _lease(target, proxy) as told:
            await made.gate.broadcast(protocol.down_event("stack down requested"))
            await asyncio.wait_for(told.lost.wait(), 10)
            assert told.lost.reason == "the shared NeMo Gym stack went down: stack down requested"
        async with _lease(target, proxy) as left:
            await made.gate.stop()  # the lease closes; nothing listens any more
            await asyncio.sleep(0.5)
            assert not left.lost.is_set() and not left.connected.is_set()  # it tries again
            await asyncio.wait_for(left.lost.wait(), 30)
            assert left.lost.reason.endswith("stopped listening") and left.links == 1


STALL_S = 8.0
"""How long the env process is stopped: what a busy 2-core machine did to one (a lease the host
ended mid-run at load 15, benchmarks/link.py), well within `tls.LINK_TIMEOUT` of silence."""

_HOLD_A_LEASE = """
import asyncio, sys
from verifiers_nemogym.bridge.proxy import NeMoGymModelProxy
from verifiers_nemogym.shared.gate_client import GateLink, describe_gate

async def main() -> None:
    target = await describe_gate(sys.argv[1], sys.argv[2], None)
    async with NeMoGymModelProxy() as proxy:
        link = GateLink(target, proxy.url, proxy.secret)
        await link.open()
        print("open", flush=True)
        await asyncio.sleep(120)

asyncio.run(main())
"""


async def test_a_stalled_env_process_keeps_its_lease(gate: tuple[Gate, ScriptedPolicy]) -> None:
    """An env process that does not run for seconds (a loaded machine) has not lost its link:
    its kernel still acknowledges, so the host keeps the lease and the model calls it carries.
    Links that stop acknowledging are what the host ends (`tls.LINK_TIMEOUT`; the cut link of
    tests/stack/test_across_hosts.py)."""
    made, _ = gate
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOLD_A_LEASE, made.gate.url, made.gate.pin,
        env={**os.environ, tls.TOKEN_ENV_VAR: made.token}, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 60) == b"open\n"
        await until(lambda: len(made.gate.users) == 1, 10, "the lease")
        proc.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(STALL_S)
        finally:
            proc.send_signal(signal.SIGCONT)
        await asyncio.sleep(1.0)
        assert len(made.gate.users) == 1 and made.changes == 1  # attached once, never left
    finally:
        proc.kill()
        await proc.wait()
