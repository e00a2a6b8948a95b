"""Attach to a NeMo Gym stack started elsewhere (`--env.taskset.stack-url`): by its head
server URL (`describe_remote`), or through the TLS listener of a shared stack host on another
host (`describe_gate` and `GateLink`, when `--env.taskset.stack-pin` is given; the wire is
`nemo/gate.py`'s).

Contract: `await describe_remote(url, proxy_host, proxy_port)` reads the running stack's merged
config (head.py's `fetch_merged_config`, as a stack started here is read) and returns its agents'
base URLs and, per agent, where a rollout's `POST /run` goes (catalog.py's `run_targets`: the
environment server fronting the agent on NeMo Gym >= 0.7, else the agent). It raises StackError
when the head server cannot be reached or returns no usable config, and ConfigError when the
stack does not match this env process: its `policy_model` must be an address this process's
model proxy listens on (the proxy IS the stack's policy model), and a `/run` target bound to
loopback cannot be used from another host. An agent or environment server bound to a wildcard
address (`+default_host=0.0.0.0` or `::`) is reached at the head server's host (the only address
of that machine known here), never at the wildcard, which would mean this machine. Every port the
config names must be an integer in 1..65535, else a one-line ConfigError. A `url` carrying
credentials (`user:password@`) is refused with a ConfigError: NeMo Gym's head server takes none,
and they would be echoed in errors and logs; no error or log quotes them. Nothing is started or
stopped here: the stack belongs to whoever started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from verifiers_nemogym import tls
from verifiers_nemogym.bridge import redact
from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.judge.blame import JudgeStatus
from verifiers_nemogym.nemo import gate, lease
from verifiers_nemogym.nemo.catalog import (
    AGENTS,
    MODELS,
    POLICY_INSTANCE,
    run_targets,
    server_blocks,
    server_urls,
)
from verifiers_nemogym.nemo.head import fetch_merged_config
from verifiers_nemogym.net import LOOPBACK, is_loopback

logger = logging.getLogger(__name__)

_WILDCARD = ("0.0.0.0", "::")


@dataclass(frozen=True)
class RemoteStack:
    """A running stack's head server, agents and `/run` targets."""

    head_url: str
    agents: dict[str, str]
    """Agent instance name -> the agent's base URL."""
    run_urls: dict[str, str]
    """Agent instance name -> base URL its rollouts' `POST /run` goes to (`run_targets`)."""
    policy_address: tuple[str, int]


def _port(value: object, what: str, head_url: str) -> int:
    """`value` as a TCP port, or a one-line ConfigError naming `what`."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ConfigError(
            f"the NeMo Gym stack at {head_url} names {what} port {str(value)[:40]!r}, "
            "which is no port (an integer in 1..65535)"
        )
    return value


def _reachable(url: str, what: str, head_host: str, head_url: str) -> str:
    """`url` (a server's base URL from the config) with its port checked and a wildcard host
    replaced by the head server's: a wildcard bind listens on every address of that machine."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    _port(port if port is not None else url.rsplit(":", 1)[-1], what, head_url)
    if (parts.hostname or "") not in _WILDCARD:
        return url
    host = f"[{head_host}]" if ":" in head_host else head_host
    return parts._replace(netloc=f"{host}:{port}").geturl()


async def describe_remote(url: str, proxy_host: str, proxy_port: int) -> RemoteStack:
    """See the module contract. `proxy_port` 0 means "the port the stack's policy_model names"."""
    head_url = url.rstrip("/")
    parts = urlsplit(head_url)
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            "--env.taskset.stack-url carries credentials (user:password@); NeMo Gym's head "
            "server takes none: remove them"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        shown = repr(url) if "@" not in url else "(not quoted: it may hold credentials)"
        raise ConfigError(f"--env.taskset.stack-url {shown} is not an http(s) URL of a head server")
    config = await fetch_merged_config(head_url)
    agents = {
        name: _reachable(target, f"agent {name!r}", parts.hostname, head_url)
        for name, target in server_urls(config, AGENTS).items()
    }
    if not agents:
        raise ConfigError(f"the NeMo Gym stack at {head_url} defines no agent server")
    run_urls = {
        name: _reachable(target, f"the /run target of agent {name!r}", parts.hostname, head_url)
        for name, target in run_targets(config).items()
    }
    for name, target in run_urls.items():
        # This process connects to the `/run` target only (an environment server reaches its
        # agent on the stack's own machine), so only the target's address must be routable.
        host = urlsplit(target).hostname or ""
        if is_loopback(host) and not is_loopback(parts.hostname):
            server = "agent" if target == agents[name] else "environment server fronting agent"
            raise ConfigError(
                f"the {server} {name!r} of the stack at {head_url} listens on {host} of that "
                "machine; start ng_run there with +default_host=<its routable address>"
            )
    policy = server_blocks(config, MODELS).get(POLICY_INSTANCE)
    if policy is None or not policy[1].get("host") or not policy[1].get("port"):
        raise ConfigError(
            f"the NeMo Gym stack at {head_url} has no `{POLICY_INSTANCE}` with a host and port; "
            "start it with this env's model proxy address as its policy_model"
        )
    policy_host = str(policy[1]["host"])
    policy_port = _port(policy[1]["port"], f"its {POLICY_INSTANCE}", head_url)
    matches_host = (
        policy_host == proxy_host
        or proxy_host in _WILDCARD
        or (is_loopback(policy_host) and is_loopback(proxy_host))
    )
    if not matches_host or (proxy_port and proxy_port != policy_port):
        raise ConfigError(
            f"the NeMo Gym stack at {head_url} calls its {POLICY_INSTANCE} at "
            f"{policy_host}:{policy_port}, but this env's model proxy would listen on "
            f"{proxy_host}:{proxy_port or policy_port}; set --env.taskset.proxy-host and "
            "--env.taskset.proxy-port to match"
        )
    return RemoteStack(head_url, agents, run_urls, (policy_host, policy_port))


# ------------------------------------------------------------------------- a stack host's gate


@dataclass(frozen=True)
class GateTarget:
    """A shared stack host's TLS listener (`stack_url` with `stack_pin`, `nemo/gate.py`), as
    `describe_gate` found it: the token it accepted, the stack's description."""

    url: str
    pin: str
    token: str = field(repr=False)
    description: dict[str, Any]

    @property
    def run_urls(self) -> dict[str, str]:
        """Agent instance name -> where its rollouts' `POST /run` goes: through the gate."""
        return {name: f"{self.url}{gate.AGENTS_PREFIX}/{name}" for name in self.agents}

    @property
    def agents(self) -> list[str]:
        return [str(a) for a in self.description.get("agents") or []]

    @property
    def policy_address(self) -> tuple[str, int]:
        """Where this env's model proxy listens: loopback, any free port (its model calls ride
        back on the lease, `GateLink`)."""
        return LOOPBACK, 0

    def client_session(self, **kwargs: Any) -> aiohttp.ClientSession:
        """An HTTP client for the gate: TLS pinned to its certificate, the token on every
        request, connections that fail within `tls.LINK_TIMEOUT` s of the link going silent."""
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=0, ssl=tls.client_ssl(self.pin), socket_factory=tls.keepalive_socket
            ),
            headers=gate.bearer(self.token),
            cookie_jar=aiohttp.DummyCookieJar(),
            **kwargs,
        )


def _gate_url(url: str) -> str:
    parts = urlsplit(url.rstrip("/"))
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            "--env.taskset.stack-url carries credentials (user:password@); give the access "
            f"token by --env.taskset.stack-token-file or {tls.TOKEN_ENV_VAR}"
        )
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "https" or not parts.hostname or port is None or parts.path:
        raise ConfigError(
            f"--env.taskset.stack-url {url[:200]!r} with --env.taskset.stack-pin must be "
            "https://HOST:PORT, as `nemo-gym-env stack up --listen` prints it"
        )
    return f"https://{parts.netloc}"


async def describe_gate(url: str, pin: str, token_file: Path | None) -> GateTarget:
    """The stack behind the gate at `url` (see `GateTarget`). One-line errors, nothing started:
    ConfigError for a malformed URL or pin, no token, a certificate other than the pinned one
    (named by both pins) or a refused token; StackError if the gate cannot be reached."""
    url = _gate_url(url)
    tls.parse_pin(pin)
    token = tls.read_token(token_file)
    redact.protect(token)
    target = GateTarget(url, pin, token, {})
    timeout = aiohttp.ClientTimeout(total=30)
    try:
        async with (
            target.client_session(timeout=timeout) as http,
            http.get(url + gate.STACK_PATH) as response,
        ):
            if response.status == 401:
                raise ConfigError(
                    f"the stack host at {url} refused the access token (the token of another "
                    "stack, or of an earlier start of it? `stack up --listen` prints its file)"
                )
            if response.status != 200:
                raise StackError(f"the stack host at {url} answered {response.status}")
            description = await response.json()
    except (ConfigError, StackError):
        raise
    except aiohttp.ServerFingerprintMismatch as e:
        raise ConfigError(
            f"the stack host at {url} presented the certificate sha256:{e.got.hex()}, not "
            f"the pinned {pin}: not that stack host (or it started anew: use the pin it printed)"
        ) from None
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        raise StackError(f"the stack host at {url} is unreachable ({type(e).__name__})") from None
    if not isinstance(description, dict) or not description.get("agents"):
        raise StackError(f"the stack host at {url} describes no agent")
    return GateTarget(url, pin, token, description)


CONNECT_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10)
"""A connection to a gate is made in 10 s or fails (a request then waits as long as it takes:
a lost link fails it through `tls.keepalive_socket`)."""


class GateLink:
    """An env process's lease on a stack host's gate (`nemo/gate.py`), kept across lost links.

    `open()` leases once (errors raise, as any failed start); then the lease is held, and each
    model call the host sends on it is posted to this process's proxy (`proxy_url`, loopback)
    and answered on it. A link that drops is connected again (every `RECONNECT_MAX` s at most);
    rollouts in flight meanwhile fail by themselves (their `/run` connections are
    `tls.keepalive_socket`s). `lost` is set, with `reason`, only when the stack is gone: the host
    said it goes down, or refused `REFUSED_MISSES` connections in a row (nothing listens)."""

    RECONNECT_MAX = 5.0
    REFUSED_MISSES = 3

    def __init__(self, target: GateTarget, proxy_url: str, proxy_secret: str) -> None:
        self.target = target
        self.proxy_url = proxy_url
        self._hello = {"op": "lease", "pid": os.getpid(), "secret": proxy_secret}
        self.lost = asyncio.Event()
        self.reason = ""
        self.connected = asyncio.Event()
        self.links = 0
        """Leases made so far (1 + reconnections)."""
        judge = target.description.get("judge")
        self.judge = JudgeStatus(dict(judge)) if isinstance(judge, dict) else None
        self._http: aiohttp.ClientSession | None = None
        self._local: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        self._http = self.target.client_session(timeout=CONNECT_TIMEOUT)
        self._local = aiohttp.ClientSession(
            cookie_jar=aiohttp.DummyCookieJar(),
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None),
        )
        try:
            first = await self._connect()
        except BaseException:
            await self.close()
            raise
        self._task = asyncio.create_task(self._keep(first))

    async def _connect(self) -> aiohttp.ClientWebSocketResponse:
        assert self._http is not None
        ws = await self._http.ws_connect(
            self.target.url + gate.LEASE_PATH,
            heartbeat=gate.HEARTBEAT,
            max_msg_size=gate.MAX_FRAME_BYTES,
            timeout=aiohttp.ClientWSTimeout(ws_close=5),
        )
        try:
            await ws.send_json(self._hello)
            async with asyncio.timeout(gate.HELLO_TIMEOUT):
                answer = await ws.receive_json()
            if not isinstance(answer, dict) or not answer.get("ok"):
                raise StackError(f"the stack host at {self.target.url} refused the lease")
        except BaseException:
            await ws.close()
            raise
        self.links += 1
        self.connected.set()
        return ws

    async def _keep(self, first: aiohttp.ClientWebSocketResponse) -> None:
        ws: aiohttp.ClientWebSocketResponse | None = first
        refused = 0
        delay = 1.0
        while True:
            if ws is not None:
                down = await self._serve(ws)
                self.connected.clear()
                if down is not None:
                    self._lose(f"the shared NeMo Gym stack went down: {down}")
                    return
                logger.warning("lost the link to the stack host %s; reconnecting", self.target.url)
            await asyncio.sleep(delay)
            try:
                ws = await self._connect()
                refused, delay = 0, 1.0
                logger.info("link to the stack host at %s is back", self.target.url)
            except aiohttp.WSServerHandshakeError as e:
                if e.status == 401:
                    self._lose(f"the stack host at {self.target.url} no longer takes the token")
                    return
                ws = None
            except aiohttp.ServerFingerprintMismatch:
                self._lose(f"the stack host at {self.target.url} presents another certificate")
                return
            except aiohttp.ClientConnectorError as e:
                ws = None
                refused = refused + 1 if isinstance(e.os_error, ConnectionRefusedError) else 0
                if refused >= self.REFUSED_MISSES:
                    self._lose(f"the stack host at {self.target.url} stopped listening")
                    return
            except (aiohttp.ClientError, StackError, TimeoutError, ValueError, OSError):
                ws = None
            delay = min(delay * 2, self.RECONNECT_MAX)

    async def _serve(self, ws: aiohttp.ClientWebSocketResponse) -> str | None:
        """Answer the host's calls until the lease closes; the host's reason if it went down."""
        down: str | None = None
        try:
            async for message in ws:
                if message.type == aiohttp.WSMsgType.BINARY:
                    task = asyncio.create_task(self._answer(ws, *gate.unframe(message.data)))
                    self._calls.add(task)
                    task.add_done_callback(self._calls.discard)
                elif message.type == aiohttp.WSMsgType.TEXT:
                    event = json.loads(message.data)
                    if event.get("event") == lease.EVENT_DOWN:
                        down = str(event.get("reason"))
                        break  # its last word: the host closes next
                    elif event.get("event") == lease.EVENT_JUDGE_FAILED and self.judge is not None:
                        self.judge.failed(lease.judge_failure_of(event))
        except (ValueError, KeyError, TypeError, AttributeError, aiohttp.ClientError) as e:
            # A malformed message ends this lease, never the link's upkeep: it connects again.
            logger.warning("bad message from the stack host: %s", type(e).__name__)
        finally:
            await ws.close()
        return down

    async def _answer(
        self, ws: aiohttp.ClientWebSocketResponse, header: dict[str, Any], body: bytes
    ) -> None:
        """Post one carried model call to this process's proxy; its answer goes back."""
        assert self._local is not None
        try:
            async with self._local.post(
                self.proxy_url + str(header["path"]), data=body, headers=header.get("headers")
            ) as response:
                payload = await response.read()
                answer = {"status": response.status, "content_type": response.content_type}
        except aiohttp.ClientError as e:
            payload = json.dumps({"error": {"message": repr(e), "type": "gone"}}).encode()
            answer = {"status": 410, "content_type": "application/json"}
        with contextlib.suppress(ConnectionError, RuntimeError, aiohttp.ClientError):
            await ws.send_bytes(gate.frame({"id": header["id"], **answer}, payload))

    def _lose(self, reason: str) -> None:
        if not self.lost.is_set():
            self.reason = reason
            self.lost.set()

    async def close(self) -> None:
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for call in list(self._calls):
            call.cancel()
        await asyncio.gather(*self._calls, return_exceptions=True)
        for session in (self._http, self._local):
            if session is not None:
                await session.close()
        self._http = self._local = None
        redact.forget(self.target.token)
