"""The real OpenSandbox server (`opensandbox-server` from the package registry) for the tests and
the container benchmark (`benchmarks.containers --provider opensandbox`).

`server_venv()` installs it once into the package cache, in a venv of its own (it pins
FastAPI, Starlette, protobuf and more, kept apart from the project's); tests/run.sh pre-builds it
with `python -m benchmarks.opensandbox_server install`. `OpenSandboxServer` starts it on 127.0.0.1
with a free port, an API key, sqlite in a temp folder, `[proxy] resolve_internal = false` and
`publish_host = 127.0.0.1` (every connection the server or the SDK makes goes to loopback), a
narrow port range and the package's stand-in execd image; `stop()` ends it by its PID (what is
left is for its user to check first: `sandboxes()`, its list API, and docker's labels).
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from verifiers_nemogym.util import cache_root, file_lock, run_checked

SERVER = "opensandbox-server==1.1.1"
SANDBOX_LABEL = "opensandbox.io/id"
"""Docker label the server puts on every sandbox container."""


def server_venv() -> Path:
    """The venv holding `SERVER` under the package cache (made now if missing: a folder
    without its `.complete` mark is made again), on the base interpreter of the Python
    running this."""
    root = cache_root() / "opensandbox-server-1.1.1"
    if (root / ".complete").exists():
        return root
    with file_lock(cache_root() / ".opensandbox-server.lock"):
        if (root / ".complete").exists():
            return root
        shutil.rmtree(root, ignore_errors=True)
        uv = shutil.which("uv") or "uv"
        python = getattr(sys, "_base_executable", sys.executable)
        run_checked([uv, "venv", "-q", "--python", python, str(root)], "uv venv", 300)
        run_checked(
            # Compiled once: the tests start this server many times, and where
            # PYTHONDONTWRITEBYTECODE is set each start would compile its imports again.
            [uv, "pip", "install", "-q", "--compile-bytecode",
             "--python", str(root / "bin" / "python"), SERVER],
            f"uv pip install {SERVER}", 900,
        )  # fmt: skip
        (root / ".complete").touch()
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CONFIG = """\
[server]
host = "127.0.0.1"
port = {port}
api_key = "{key}"
max_sandbox_timeout_seconds = 86400
[proxy]
resolve_internal = false
[log]
level = "INFO"
[runtime]
type = "docker"
execd_image = "{execd}"
[store]
type = "sqlite"
path = "{folder}/opensandbox.db"
[docker]
network_mode = "bridge"
port_range_min = {low}
port_range_max = {high}
publish_host = "127.0.0.1"
drop_capabilities = ["AUDIT_WRITE", "MKNOD", "NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_MODULE",
                     "SYS_PTRACE", "SYS_TIME", "SYS_TTY_CONFIG"]
no_new_privileges = true
pids_limit = 4096
[ingress]
mode = "direct"
[renew_intent]
enabled = false
"""


class OpenSandboxServer:
    """One server process (module contract). `url`, `key`, `log` once started."""

    def __init__(self, execd_image: str, folder: Path) -> None:
        self.execd_image = execd_image
        self.folder = folder
        self.port = free_port()
        self.key = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = folder / "server.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120) -> None:
        low = 20000 + (self.port * 7) % 12000  # 200 ports (its minimum) below the ephemeral range
        config = self.folder / "config.toml"
        config.write_text(
            CONFIG.format(
                port=self.port, key=self.key, execd=self.execd_image, folder=self.folder,
                low=low, high=low + 199,
            )
        )  # fmt: skip
        binary = server_venv() / "bin" / "opensandbox-server"
        with self.log.open("wb") as out:
            self._proc = subprocess.Popen(
                [str(binary), "--config", str(config)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"opensandbox-server exited: {self.log.read_text()[-2000:]}")
            try:
                if self.call("GET", "/health").get("status") == "healthy":
                    return
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"opensandbox-server not healthy in {timeout:.0f} s")

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The JSON answer of the lifecycle API (urllib's HTTPError for a 4xx/5xx)."""
        headers = {"OPEN-SANDBOX-API-KEY": self.key, "Content-Type": "application/json"}
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}{path}", data=data, method=method, headers=headers
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = response.read()
        return json.loads(answer) if answer.strip() else None

    def sandboxes(self) -> list[dict[str, Any]]:
        """Every sandbox the server lists (first 200)."""
        return list(self.call("GET", "/v1/sandboxes?pageSize=200").get("items") or [])

    def create(self, image: str, metadata: dict[str, str]) -> str:
        """A sandbox of `image` carrying `metadata` (idle: `tail -f /dev/null`); its id."""
        made = self.call(
            "POST", "/v1/sandboxes",
            {"image": {"uri": image}, "entrypoint": ["tail", "-f", "/dev/null"], "timeout": 600,
             "resourceLimits": {"cpu": "500m", "memory": "256Mi"}, "metadata": metadata},
        )  # fmt: skip
        return str(made["id"])

    def kill(self) -> None:
        """The server going down at once (SIGKILL): what it made stays in docker; `start()`
        brings it back on the same port and key, listing those sandboxes again (its docker
        runtime keeps no state of its own)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def stop(self) -> None:
        """Stop the server by its PID (SIGTERM, then SIGKILL after 30 s)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__" and sys.argv[1:] == ["install"]:
    print(server_venv())
elif __name__ == "__main__":
    raise SystemExit("usage: python -m benchmarks.opensandbox_server install")
