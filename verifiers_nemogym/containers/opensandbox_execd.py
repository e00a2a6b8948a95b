#!/usr/bin/env python3
"""A stand-in for OpenSandbox's in-sandbox daemon `execd`: test equipment, not a product.

OpenSandbox's server copies `execd` and `bootstrap.sh` from an "execd image" into every sandbox
and starts it on port 44772. The real execd is a Go binary shipped only as a container-registry
image; this file serves, with the Python standard library only (it runs on the sandbox image's
`python3`, 3.11 or later: Debian bookworm's), the subset of OpenSandbox's published execd API
that the `opensandbox` SDK 1.1.1 and NeMo Gym 0.7.0's `OpenSandboxProvider` call
(docs/containers.md):

- `GET /ping`: 200.
- `POST /command` (JSON `command`, `cwd`, `background`, `timeout` in ms, `uid`, `gid`, `envs`):
  runs `bash -c command` in its own process group and answers with execd's server-sent events,
  bare `JSON\\n\\n` frames: `init` (the command's id), then for a foreground command `stdout` /
  `stderr` pieces and `execution_complete` (exit 0) or `error` (`evalue` the exit code, -9 when
  its timeout killed it); a background command's stream ends after `init`, its output (stdout and
  stderr in one buffer) is read back through the two routes below.
- `GET /command/status/{id}`: `id`, `running`, `exit_code`, `error`, `started_at`, `finished_at`.
- `GET /command/{id}/logs?cursor=N`: the output from byte N, the end offset in header
  `EXECD-COMMANDS-TAIL-CURSOR`.
- `DELETE /command?id=` and `POST /command/{id}/interrupt`: SIGKILL to the command's group.
- `POST /files/upload`: multipart (a `metadata` JSON part with `path`, `mode`, `owner`, `group`,
  then a `file` part, repeated), with a `Content-Length` or chunked body; parent folders made.
- `GET /files/download?path=`: the whole file (no ranges or line windows).
- Any path may carry the prefix `/proxy/44772` (how the server's direct endpoint reaches execd).

Everything else is 404: PTY websockets, sessions, `/code`, execd's own `/proxy/<port>` to other
ports, the other file routes, metrics, and the egress sidecar execd cooperates with.
"""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PORT = 44772
"""execd's port, as OpenSandbox's server publishes and proxies it."""
PREFIX = f"/proxy/{PORT}"
CURSOR_HEADER = "EXECD-COMMANDS-TAIL-CURSOR"


def _now_ms() -> int:
    return int(time.time() * 1000)


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


class Command:
    """One command's process and what it printed (a background one: one combined buffer)."""

    def __init__(self, ident: str, request: dict[str, Any]) -> None:
        self.id = ident
        self.output = bytearray()
        self.exit_code: int | None = None
        self.error: str | None = None
        self.started = time.time()
        self.finished: float | None = None
        self.lock = threading.Lock()
        self.done = threading.Event()
        background = bool(request.get("background"))
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in (request.get("envs") or {}).items()})
        uid, gid = request.get("uid"), request.get("gid")
        shell = shutil.which("bash") or "/bin/sh"
        self.proc = subprocess.Popen(
            [shell, "-c", str(request.get("command") or "")],
            cwd=request.get("cwd") or None,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if background else subprocess.PIPE,
            start_new_session=True,
            user=uid if isinstance(uid, int) else None,
            group=gid if isinstance(gid, int) else None,
        )
        timeout_ms = request.get("timeout")
        if isinstance(timeout_ms, int) and timeout_ms > 0:
            timer = threading.Timer(timeout_ms / 1000, self.kill)
            timer.daemon = True
            timer.start()

    def kill(self) -> None:
        """SIGKILL to the command's process group (it is the group's leader)."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def finish(self) -> int:
        code = self.proc.wait()
        with self.lock:
            self.exit_code = code
            self.finished = time.time()
            if code != 0:
                self.error = f"exit status {code}"
        self.done.set()
        return code

    def status(self) -> dict[str, Any]:
        with self.lock:
            return {
                "id": self.id,
                "running": not self.done.is_set(),
                "exit_code": self.exit_code,
                "error": self.error,
                "started_at": _iso(self.started),
                "finished_at": _iso(self.finished),
            }


COMMANDS: dict[str, Command] = {}
_COUNTER = [0]
_COUNTER_LOCK = threading.Lock()


def _new_id() -> str:
    with _COUNTER_LOCK:
        _COUNTER[0] += 1
        return f"cmd-{os.getpid()}-{_COUNTER[0]}"


def _pump(stream: Any, kind: str, command: Command, events: "list[Any] | None") -> None:
    """Copy `stream` into the command's buffer, and as events when someone streams them."""
    for chunk in iter(lambda: stream.read1(65536), b""):
        with command.lock:
            command.output.extend(chunk)
        if events is not None:
            events.append((kind, chunk.decode("utf-8", "replace")))
    stream.close()


def multipart(body: bytes, content_type: str) -> list[tuple[dict[str, str], bytes]]:
    """The parts of a multipart body: (headers with lower-case names, content)."""
    found = re.search(r'boundary="?([^";]+)"?', content_type)
    if found is None:
        raise ValueError("multipart body without a boundary")
    delimiter = b"--" + found.group(1).encode()
    parts = []
    for piece in body.split(delimiter)[1:]:
        if piece.startswith(b"--"):
            break
        piece = piece[2:] if piece.startswith(b"\r\n") else piece
        head, _, content = piece.partition(b"\r\n\r\n")
        headers = {}
        for line in head.decode("utf-8", "replace").split("\r\n"):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        parts.append((headers, content[:-2] if content.endswith(b"\r\n") else content))
    return parts


def write_upload(metadata: dict[str, Any], content: bytes) -> None:
    """Write one uploaded file as its metadata says (mode in octal digits, e.g. 755)."""
    path = str(metadata.get("path") or "")
    if not path.startswith("/"):
        raise ValueError(f"upload path must be absolute: {path!r}")
    os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(content)
    mode = metadata.get("mode")
    if isinstance(mode, int) and mode > 0:
        os.chmod(path, int(str(mode), 8))
    owner, group = metadata.get("owner"), metadata.get("group")
    if owner:
        shutil.chown(path, user=str(owner))
    if group:
        shutil.chown(path, group=str(group))


class Handler(BaseHTTPRequestHandler):
    """The routes of the module contract."""

    protocol_version = "HTTP/1.1"
    server_version = "opensandbox-execd-standin/1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # ------------------------------------------------------------------ plumbing

    def _route(self) -> tuple[str, dict[str, list[str]]]:
        parts = urlsplit(self.path)
        path = parts.path
        if path == PREFIX or path.startswith(PREFIX + "/"):
            path = path[len(PREFIX) :] or "/"
        return path, parse_qs(parts.query)

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            data = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(data)
                data.extend(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send(
        self, status: int, body: bytes, kind: str = "application/json", **headers: str
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, value: Any) -> None:
        self._send(status, json.dumps(value).encode())

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"code": "STANDIN_EXECD", "message": message})

    def _event(self, event: dict[str, Any]) -> None:
        frame = json.dumps({**event, "timestamp": _now_ms()}).encode() + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
        self.wfile.flush()

    # ------------------------------------------------------------------ routes

    def do_GET(self) -> None:
        path, query = self._route()
        if path == "/ping":
            return self._send(200, b"")
        if path.startswith("/command/status/"):
            command = COMMANDS.get(path[len("/command/status/") :])
            if command is None:
                return self._error(404, "no such command")
            return self._json(200, command.status())
        logs = re.fullmatch(r"/command/([^/]+)/logs", path)
        if logs:
            command = COMMANDS.get(logs.group(1))
            if command is None:
                return self._error(404, "no such command")
            cursor = int((query.get("cursor") or ["0"])[0] or 0)
            with command.lock:
                content, end = bytes(command.output[cursor:]), len(command.output)
            return self._send(
                200, content, "text/plain; charset=utf-8", **{CURSOR_HEADER: str(end)}
            )
        if path == "/files/download":
            target = (query.get("path") or [""])[0]
            if not os.path.isfile(target):
                return self._error(404, f"no such file: {target}")
            with open(target, "rb") as handle:
                return self._send(200, handle.read(), "application/octet-stream")
        return self._error(404, f"not served by the stand-in execd: GET {path}")

    def do_DELETE(self) -> None:
        path, query = self._route()
        if path == "/command":
            return self._interrupt((query.get("id") or [""])[0])
        return self._error(404, f"not served by the stand-in execd: DELETE {path}")

    def do_POST(self) -> None:
        path, _ = self._route()
        body = self._body()
        if path == "/command":
            return self._run(json.loads(body or b"{}"))
        interrupt = re.fullmatch(r"/command/([^/]+)/interrupt", path)
        if interrupt:
            return self._interrupt(interrupt.group(1))
        if path == "/files/upload":
            try:
                parts = multipart(body, self.headers.get("Content-Type", ""))
                metadata: dict[str, Any] | None = None
                for headers, content in parts:
                    name = re.search(r'name="([^"]*)"', headers.get("content-disposition", ""))
                    if name and name.group(1) == "metadata":
                        metadata = json.loads(content)
                    elif name and name.group(1) == "file" and metadata is not None:
                        write_upload(metadata, content)
                        metadata = None
            except (OSError, ValueError, KeyError, LookupError) as e:
                return self._error(500, f"upload failed: {e}")
            return self._send(200, b"")
        return self._error(404, f"not served by the stand-in execd: POST {path}")

    def _interrupt(self, ident: str) -> None:
        command = COMMANDS.get(ident)
        if command is None:
            return self._error(404, "no such command")
        command.kill()
        return self._send(200, b"")

    def _run(self, request: dict[str, Any]) -> None:
        ident = _new_id()
        try:
            command = Command(ident, request)
        except (OSError, ValueError, KeyError) as e:
            return self._error(500, f"cannot start the command: {e}")
        COMMANDS[ident] = command
        background = bool(request.get("background"))
        events: list[Any] | None = None if background else []
        streams = [(command.proc.stdout, "stdout"), (command.proc.stderr, "stderr")]
        pumps = [
            threading.Thread(target=_pump, args=(s, k, command, events), daemon=True)
            for s, k in streams
            if s is not None
        ]
        for pump in pumps:
            pump.start()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._event({"type": "init", "text": ident})
        if background:
            threading.Thread(target=self._reap, args=(command, pumps), daemon=True).start()
        else:
            assert events is not None
            while True:
                done = command.proc.poll() is not None and not any(p.is_alive() for p in pumps)
                while events:
                    kind, text = events.pop(0)
                    self._event({"type": kind, "text": text})
                if done:
                    break
                time.sleep(0.05)
            code = self.__class__._finish(command, pumps)
            took = int((time.time() - command.started) * 1000)
            if code == 0:
                self._event({"type": "execution_complete", "execution_time": took})
            else:
                error = {"ename": "CommandExecError", "evalue": str(code), "traceback": []}
                self._event({"type": "error", "error": error})
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    @staticmethod
    def _finish(command: Command, pumps: list[threading.Thread]) -> int:
        for pump in pumps:
            pump.join()
        return command.finish()

    @classmethod
    def _reap(cls, command: Command, pumps: list[threading.Thread]) -> None:
        cls._finish(command, pumps)


def main() -> None:
    """Serve on 0.0.0.0:44772 (or `[port [host]]` from the command line) until killed."""
    port = int(sys.argv[1]) if len(sys.argv) > 1 else PORT
    host = sys.argv[2] if len(sys.argv) > 2 else "0.0.0.0"
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
