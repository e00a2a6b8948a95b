"""The shared-stack lease protocol: what a stack host (`shared/host.py`) and its clients
(`shared/client.py`: env processes and the `stack` commands) both know, and nothing else.

- The stack folder (`<cache>/stacks/<key>/`, mode 0700) and its files (`LOCK`, `HOST_LOCK`,
  `SOCKET`, `LOG`, `PREVIOUS_LOG`; their roles: docs/shared-stacks.md).
- The host program: `python -m HOST_MODULE --dir D --spec J [--lock-fd N]`, with `HostSpec` J
  and the judge's secrets as one JSON line on its stdin (`host_secrets`), `HOST_ENV_VAR` in
  its environment.
- Messages: one JSON object per line. A client opens with `{"op": ...}`: `OP_LEASE` (hello with
  pid, proxy URL and secret; answered with the host's status, then held open), `OP_STATUS`,
  `OP_PERSIST` (with `idle_timeout`), `OP_DOWN`. The host answers `{"ok": false, "error": ...}`
  when it refuses, and tells lease holders `{"event": ...}`: `EVENT_JUDGE_FAILED` (a
  `JudgeFailure`) and `EVENT_DOWN` (with its reason) before it closes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verifiers_nemogym.errors import StackError
from verifiers_nemogym.judge.blame import JudgeFailure, JudgeStatus
from verifiers_nemogym.judge.endpoint import Judge
from verifiers_nemogym.nemo.ray_cluster import RayCluster

HOST_MODULE = "verifiers_nemogym.shared.host"
"""The host program, run as `python -m` (a client never imports it)."""
HOST_ENV_VAR = "VF_NEMOGYM_STACK_HOST"
"""Set (to the stack key) in the stack host's environment, so scans can find hosts."""
LINE_LIMIT = 1 << 20
"""Longest message line either end reads."""
UNCLAIMED_GRACE = 60.0
"""Seconds a ready host waits for its first lease (or `stack up`'s persist) before it stops:
its starter was cancelled or killed while it started."""
SOCKET_PATH_MAX = 107
"""The longest unix socket path Linux accepts (sun_path is 108 bytes with its NUL)."""

OP_LEASE = "lease"
OP_STATUS = "status"
OP_PERSIST = "persist"
OP_DOWN = "down"
EVENT_JUDGE_FAILED = "judge_failed"
EVENT_DOWN = "down"

LOCK = "lock"
"""A flock serialising attach, start and stop decisions."""
HOST_LOCK = "host.lock"
"""Flocked by the live host for its whole life."""
SOCKET = "host.sock"
LOG = "host.log"
PREVIOUS_LOG = "host.log.1"


@dataclass(frozen=True)
class HostSpec:
    """What a stack host starts: passed to the host program as JSON (`--spec`)."""

    nemo_gym_version: str
    python: str
    config_paths: list[str]
    idle_timeout: float | None
    start_timeout: float
    persistent: bool = False
    below_floor: bool = False
    """The runtime was built below its release's declared Python floor (the explicit opt-in)."""
    judge: dict[str, Any] | None = None
    """The stack's judge (`Judge.to_dict`: no secrets; those reach the host on its stdin,
    `host_secrets`)."""
    ray: dict[str, Any] | None = None
    """The user's Ray cluster the stack joins (`RayCluster.to_dict`: no token; a token given
    by value reaches the host on its stdin, `host_secrets`), or None for a private Ray."""
    allow_unisolated_containers: bool = False
    """Sandbox containers the package cannot isolate run anyway (the explicit opt-in)."""
    sandbox_packages: list[str] = dataclasses.field(default_factory=list)
    """Requirement lines added to the venvs of the servers that start sandboxes (checked by
    `containers.sandbox.check_sandbox_packages`: no credentials)."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> HostSpec:
        return cls(**json.loads(text))

    def judge_with(self, secrets: dict[str, Any]) -> Judge | None:
        """The spec's judge with the secrets the host got on its stdin (`host_secrets`)."""
        if self.judge is None:
            return None
        return Judge.from_dict(self.judge, secrets.get("judge"))

    def ray_with(self, secrets: dict[str, Any]) -> RayCluster | None:
        """The spec's Ray cluster with the token the host got on its stdin, if any."""
        if self.ray is None:
            return None
        token = secrets.get("ray_token")
        return RayCluster.from_dict(self.ray, str(token) if token is not None else None)


def host_secrets(judge: Judge | None, ray: RayCluster | None = None) -> dict[str, Any]:
    """What a host gets on its stdin: the judge's secrets (`Judge.secrets`) and the Ray
    cluster's token when it was given by value (`RayCluster.secrets`)."""
    return {
        "judge": judge.secrets() if judge is not None else None,
        "ray_token": ray.secrets() if ray is not None else None,
    }


def check_idle_timeout(value: object) -> float | None:
    """An idle timeout as a host takes it: None (no limit) or a finite number >= 0 of seconds;
    else StackError."""
    if value is None:
        return None
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not math.isfinite(seconds) or seconds < 0:
        raise StackError(f"idle timeout {value!r} is not a finite number of seconds >= 0")
    return seconds


def lease_hello(proxy_url: str, proxy_secret: str) -> dict[str, Any]:
    return {"op": OP_LEASE, "pid": os.getpid(), "proxy_url": proxy_url, "secret": proxy_secret}


def judge_failed_event(failure: JudgeFailure) -> dict[str, Any]:
    return {"event": EVENT_JUDGE_FAILED, **dataclasses.asdict(failure)}


def judge_failure_of(event: dict[str, Any]) -> JudgeFailure:
    """The `JudgeFailure` of an `EVENT_JUDGE_FAILED` event (ValueError/KeyError if malformed)."""
    return JudgeFailure(str(event["message"]), float(event["at"]), str(event.get("prompt") or ""))


def take_event(event: dict[str, Any], judge: JudgeStatus | None) -> str | None:
    """A host's event, as a lease of either kind (unix socket or gate) takes it: a judge failure
    is told to `judge`; `EVENT_DOWN` gives the host's reason; anything else None. ValueError or
    KeyError if malformed."""
    if event.get("event") == EVENT_JUDGE_FAILED and judge is not None:
        judge.failed(judge_failure_of(event))
    elif event.get("event") == EVENT_DOWN:
        return str(event.get("reason"))
    return None


def down_event(reason: str) -> dict[str, Any]:
    return {"event": EVENT_DOWN, "reason": reason}


def refusal(error: str) -> dict[str, Any]:
    return {"ok": False, "error": error}


def peer_uid(writer: asyncio.StreamWriter) -> int:
    """The uid of the process at the other end of a unix socket connection (SO_PEERCRED)."""
    sock = writer.get_extra_info("socket")
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def post(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    """Queue one message without waiting for it to drain (for callers that cannot await)."""
    writer.write(json.dumps(message).encode() + b"\n")


async def send(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    post(writer, message)
    await writer.drain()


async def receive(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message, or None at EOF; ValueError if it is not a JSON object."""
    line = await reader.readline()
    if not line:
        return None
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("a message must be a JSON object")
    return message


async def connect(path: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the host socket at `path` whose listener runs as our uid; StackError
    (nothing sent) if another user serves it; OSError if nothing listens."""
    reader, writer = await asyncio.open_unix_connection(path, limit=LINE_LIMIT)
    uid = peer_uid(writer)
    if uid != os.getuid():
        writer.close()
        raise StackError(
            f"the shared stack socket {path} is served by uid {uid}, not by you "
            f"(uid {os.getuid()}); refusing it: set VF_NEMOGYM_CACHE to a private folder"
        )
    return reader, writer


async def request(directory: Path, message: dict[str, Any], timeout: float = 10) -> dict[str, Any]:
    """Send one control message (`OP_STATUS`, `OP_PERSIST`, `OP_DOWN`) to the host in
    `directory`; its answer. StackError if no host (of our uid) listens there."""
    path = directory / SOCKET
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await connect(path)
            try:
                await send(writer, message)
                answer = await receive(reader)
            finally:
                writer.close()
    except (OSError, TimeoutError, ValueError) as e:
        raise StackError(f"no shared NeMo Gym stack answers at {path} ({e!r})") from None
    if answer is None:
        raise StackError(f"the shared NeMo Gym stack at {path} closed without answering")
    return answer


async def status(directory: Path, timeout: float = 10) -> dict[str, Any]:
    """The host's status (`OP_STATUS`); StackError if none answers."""
    return await request(directory, {"op": OP_STATUS}, timeout)
