"""The stand-in execd (`containers.opensandbox_execd`), run on loopback as the sandbox runs it
(`python3 execd`), spoken to as the opensandbox SDK speaks: the event stream of a foreground
command, a non-zero exit, a timeout's kill, a background command's status and logs, a chunked
multipart upload through the `/proxy/44772` prefix and the download, and 404 for what it does
not serve. And the provider's config reading (`providers.opensandbox`)."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from verifiers_nemogym.containers import opensandbox_execd
from verifiers_nemogym.containers.providers.opensandbox import Server, resolve
from verifiers_nemogym.errors import ConfigError


@pytest.fixture(scope="module")
def execd() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, opensandbox_execd.__file__, str(port), "127.0.0.1"],
        stdin=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                if call(port, "GET", "/ping")[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        yield port
    finally:
        proc.kill()
        proc.wait()


def call(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        if headers and headers.get("Transfer-Encoding") == "chunked":
            connection.putrequest(method, path)
            for name, value in headers.items():
                connection.putheader(name, value)
            connection.endheaders()
            for i in range(0, len(body or b""), 7):  # odd-sized chunks, as a proxy may send
                piece = (body or b"")[i : i + 7]
                connection.send(b"%x\r\n%s\r\n" % (len(piece), piece))
            connection.send(b"0\r\n\r\n")
        else:
            connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def run(port: int, **request: Any) -> list[dict[str, Any]]:
    status, headers, body = call(port, "POST", "/command", json.dumps(request).encode())
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    frames = [f for f in body.split(b"\n\n") if f.strip()]
    return [json.loads(f) for f in frames]  # bare JSON frames, as the real execd writes


def test_a_foreground_command_streams_init_output_and_completion(execd: int) -> None:
    events = run(execd, command="echo out; echo err >&2; pwd", cwd="/tmp", envs={"A": "1"})
    assert events[0]["type"] == "init" and events[0]["text"]
    out = "".join(e["text"] for e in events if e["type"] == "stdout")
    assert out == "out\n/tmp\n"
    assert "".join(e["text"] for e in events if e["type"] == "stderr") == "err\n"
    assert events[-1]["type"] == "execution_complete"
    assert all(isinstance(e["timestamp"], int) for e in events)


def test_a_failing_or_timed_out_command_ends_with_its_exit_code_as_an_error(execd: int) -> None:
    assert run(execd, command="exit 7")[-1]["error"]["evalue"] == "7"
    began = time.monotonic()
    assert run(execd, command="sleep 30", timeout=500)[-1]["error"]["evalue"] == "-9"
    assert time.monotonic() - began < 20


def test_a_background_command_reports_status_and_logs_from_a_cursor(execd: int) -> None:
    (init,) = run(execd, command="echo one; echo two >&2; exit 3", background=True)
    ident = init["text"]
    for _ in range(100):
        status = json.loads(call(execd, "GET", f"/command/status/{ident}")[2])
        if not status["running"]:
            break
        time.sleep(0.1)
    assert status["exit_code"] == 3 and status["error"] == "exit status 3"
    assert status["started_at"].endswith("Z") and status["finished_at"]
    code, headers, body = call(execd, "GET", f"/command/{ident}/logs")
    assert code == 200 and body == b"one\ntwo\n"
    assert headers["EXECD-COMMANDS-TAIL-CURSOR"] == "8"
    assert call(execd, "GET", f"/command/{ident}/logs?cursor=4")[2] == b"two\n"
    assert call(execd, "GET", "/command/status/nope")[0] == 404


def test_an_upload_through_the_proxy_prefix_lands_and_downloads(execd: int, tmp_path: Path) -> None:
    target = tmp_path / "made" / "file.bin"
    data = bytes(range(256)) * 3 + b"\r\n--not-the-boundary\r\n"
    metadata = json.dumps({"path": str(target), "mode": 640}).encode()
    body = (
        b'--B0\r\nContent-Disposition: form-data; name="metadata"; filename="metadata"\r\n'
        b"Content-Type: application/json\r\n\r\n" + metadata + b"\r\n"
        b'--B0\r\nContent-Disposition: form-data; name="file"; filename="file.bin"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n" + data + b"\r\n--B0--\r\n"
    )
    headers = {"Content-Type": "multipart/form-data; boundary=B0", "Transfer-Encoding": "chunked"}
    assert call(execd, "POST", "/proxy/44772/files/upload", body, headers)[0] == 200
    assert target.read_bytes() == data and target.stat().st_mode & 0o777 == 0o640
    code, _, got = call(execd, "GET", f"/files/download?path={target}")
    assert code == 200 and got == data
    assert call(execd, "GET", f"/files/download?path={tmp_path}/absent")[0] == 404


def test_what_it_does_not_serve_is_404(execd: int) -> None:
    for method, path in [("GET", "/code/contexts"), ("POST", "/session"), ("GET", "/proxy/8080/")]:
        assert call(execd, method, path, b"{}" if method == "POST" else None)[0] == 404


def test_the_provider_reads_the_shipped_configs_environment_references(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = {
        "connection": {
            "domain": "${oc.env:OPENSANDBOX_DOMAIN,opensandbox-server.svc}",
            "api_key": "${oc.env:OPENSANDBOX_API_KEY}",
            "protocol": "http",
        }
    }
    monkeypatch.delenv("OPENSANDBOX_DOMAIN", raising=False)
    monkeypatch.delenv("OPENSANDBOX_API_KEY", raising=False)
    assert resolve(settings["connection"]["domain"]) == "opensandbox-server.svc"
    with pytest.raises(ConfigError, match="set OPENSANDBOX_API_KEY"):
        Server.from_settings(settings)
    monkeypatch.setenv("OPENSANDBOX_API_KEY", "k")
    assert Server.from_settings(settings) == Server("http://opensandbox-server.svc", "k")
    monkeypatch.setenv("OPENSANDBOX_DOMAIN", "https://osb.example:8443/")
    assert Server.from_settings(settings).base_url == "https://osb.example:8443"
