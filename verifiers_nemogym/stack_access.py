"""The NeMo Gym stack an env process's rollouts use: one contract (`Stack`), four backends.

`open_stack` picks the backend from the taskset config: `SharedStack` (default, a lease),
`PrivateStack` (`shared_stack=False`), `AttachedStack` (`stack_url`) or `GateStack`
(`stack_url` with `stack_pin`, a lease over a stack host's TLS listener). Each backend:
docs/architecture.md, "Modules"; the shared and remote ones: docs/shared-stacks.md.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from verifiers_nemogym.bridge.proxy import NeMoGymModelProxy
from verifiers_nemogym.containers.seam import StackSandboxes
from verifiers_nemogym.errors import StackError
from verifiers_nemogym.judge.blame import JudgeStatus
from verifiers_nemogym.judge.endpoint import Judge
from verifiers_nemogym.nemo.attached import AttachedTarget, describe_attached
from verifiers_nemogym.nemo.ray_cluster import RayCluster
from verifiers_nemogym.nemo.stack import CHECK_ALIVE_INTERVAL, NeMoGymStack, start_stack
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.net import forwarding_session
from verifiers_nemogym.shared import protocol
from verifiers_nemogym.shared.client import Lease, attach_or_start
from verifiers_nemogym.shared.gate_client import (
    CONNECT_TIMEOUT,
    GateLink,
    GateTarget,
    describe_gate,
)
from verifiers_nemogym.util import Latch, cancel_and_wait

logger = logging.getLogger(__name__)

REMOTE_WATCH_INTERVAL = 5.0
"""Seconds between checks that a remote stack's head server still answers."""
REMOTE_MISSES = 3
"""Refused checks in a row after which a remote stack counts as lost (slow is not dead)."""


class Stack(ABC):
    """A running NeMo Gym stack that rollouts POST `/run` to. `run_urls` maps each agent instance
    to its `/run` target (`nemo.catalog.run_targets` of the stack's merged config, for every
    backend); `marker` is its process marker (`VF_NEMOGYM_STACK=<marker>` in every NeMo Gym
    process of it; None for a stack started elsewhere); `lost` is set, with its reason, once it is
    unusable; `close()` (idempotent) stops what this process owns, releases a lease, or only stops
    watching; `judge` is its judge's status when it has one."""

    marker: str | None = None
    judge: JudgeStatus | None = None

    def __init__(self, run_urls: dict[str, str]) -> None:
        """Starts watching the stack (`_watch_stack`, first run at the caller's next await, after
        the subclass's `__init__`): call it on the running event loop."""
        self.run_urls = dict(run_urls)
        self.lost = Latch()
        self._watch: asyncio.Task[None] | None = asyncio.create_task(self._watch_stack())

    @abstractmethod
    async def _watch_stack(self) -> None:
        """Until the stack is lost (then `lost.set` with the reason); cancelled by `close()`."""

    async def close(self) -> None:
        watch, self._watch = self._watch, None
        await cancel_and_wait(watch)
        await self._release()

    @abstractmethod
    async def _release(self) -> None:
        """Give up what this backend holds (after its watch stopped)."""

    async def judge_summary(self) -> str | None:
        """The judge's calls, failures and tokens on this stack so far (None: no judge)."""
        return None

    def client_session(self) -> aiohttp.ClientSession:
        """The HTTP client for `/run` (call on the running loop). No cookie jar: NeMo Gym keys
        agent sessions by cookie, and each `/run` is its own session."""
        return forwarding_session()

    @abstractmethod
    def describe(self) -> tuple[str, str]:
        """For the log line once it is open: what happened ("attached to shared NeMo Gym
        stack"), and where it is (host, head server)."""


class PrivateStack(Stack):
    """A stack this process started; `process` is its `ng_run` and servers."""

    def __init__(self, process: NeMoGymStack) -> None:
        super().__init__(process.run_urls)
        self.process = process
        self.marker = process.marker
        self.judge = process.relay.status if process.relay is not None else None

    async def _watch_stack(self) -> None:
        # A dead server is reported once, and every rollout fails fast with the reason. The stack
        # is not restarted: a server that died mid-run (out of memory, a crash) would most likely
        # die again, and a restart would hide it.
        while True:
            await asyncio.sleep(CHECK_ALIVE_INTERVAL)
            try:
                await self.process.check_alive()
            except StackError as e:
                self.lost.set(str(e))
                return

    async def _release(self) -> None:
        await self.process.stop()

    async def judge_summary(self) -> str | None:
        return self.process.relay.stats.summary() if self.process.relay is not None else None

    def describe(self) -> tuple[str, str]:
        return "NeMo Gym stack ready: started private NeMo Gym stack", self.process.head_url


class SharedStack(Stack):
    """A lease on the machine's shared stack for this config set."""

    def __init__(self, lease: Lease) -> None:
        super().__init__(lease.run_urls)
        self.lease = lease
        self.marker = lease.marker
        self.judge = lease.judge

    async def _watch_stack(self) -> None:
        # The host closes the lease when the stack died, on `stack down`, or when it is killed;
        # its last word is the reason.
        self.lost.set(await self.lease.lost.wait())

    async def _release(self) -> None:
        await self.lease.close()

    async def judge_summary(self) -> str | None:
        if self.judge is None:
            return None
        try:
            status = await protocol.status(self.lease.directory, timeout=5)
        except StackError as e:
            return f"unknown ({e})"
        return str(status.get("judge_stats") or "unknown")

    def describe(self) -> tuple[str, str]:
        how = "NeMo Gym stack ready: started" if self.lease.started else "attached to"
        where = f"host pid {self.lease.host_pid}, head {self.lease.head_url}"
        return f"{how} shared NeMo Gym stack", where


class AttachedStack(Stack):
    """A stack started elsewhere (`stack_url`); it belongs to whoever started it."""

    def __init__(self, remote: AttachedTarget) -> None:
        super().__init__(remote.run_urls)
        self.remote = remote

    async def _watch_stack(self) -> None:
        missed = 0
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            while missed < REMOTE_MISSES:
                await asyncio.sleep(REMOTE_WATCH_INTERVAL)
                try:
                    async with http.get(self.remote.head_url) as response:
                        await response.read()
                    missed = 0
                except aiohttp.ClientConnectorError:
                    missed += 1
                except (aiohttp.ClientError, TimeoutError):
                    pass  # slow is not dead
        self.lost.set(f"the NeMo Gym stack at {self.remote.head_url} stopped answering")

    async def _release(self) -> None:
        return None  # nothing of it is ours

    def describe(self) -> tuple[str, str]:
        return "attached to the NeMo Gym stack started elsewhere", self.remote.head_url


class GateStack(Stack):
    """A lease on a shared stack host on another host, through its TLS listener."""

    def __init__(self, link: GateLink) -> None:
        super().__init__(link.target.run_urls)
        self.link = link
        self.judge = link.judge

    async def _watch_stack(self) -> None:
        self.lost.set(await self.link.lost.wait())

    async def _release(self) -> None:
        await self.link.close()

    def client_session(self) -> aiohttp.ClientSession:
        return self.link.target.client_session(timeout=CONNECT_TIMEOUT)

    def describe(self) -> tuple[str, str]:
        pid = self.link.target.description.get("pid")
        where = f"{self.link.target.url}, host pid {pid}"
        return "attached to shared NeMo Gym stack on another host", where


async def open_stack(
    *,
    runtime: NeMoGymVenv,
    config_paths: list[Path],
    proxy: NeMoGymModelProxy,
    remote: AttachedTarget | GateTarget | None,
    shared: bool,
    idle_timeout: float,
    start_timeout: float,
    judge: Judge | None = None,
    ray: RayCluster | None = None,
    allow_unisolated_containers: bool = False,
    sandbox_packages: Sequence[str] = (),
) -> Stack:
    """The stack the taskset config asks for (the module names the four); `remote` is the
    `stack_url` stack (`describe_stack_url`), if one was named. The proxy must be serving
    already: the stack's `policy_model` is its address (or, shared, the host's front
    forwarder's). A `judge` (carrying its key, held by the process that runs the stack) serves
    the stack's judge references; it is part of a shared stack's identity, as is `ray`, the
    user's Ray cluster a stack started here joins (`nemo/ray_cluster.py`), and so are
    `sandbox_packages`, the requirement lines of its sandbox servers' venvs."""
    if isinstance(remote, GateTarget):
        link = GateLink(remote, proxy.url, proxy.secret)
        await link.open()
        return GateStack(link)
    if remote is not None:
        return AttachedStack(remote)
    if shared:
        return SharedStack(
            await attach_or_start(
                runtime, config_paths, proxy_url=proxy.url, proxy_secret=proxy.secret,
                idle_timeout=idle_timeout, start_timeout=start_timeout, judge=judge, ray=ray,
                allow_unisolated_containers=allow_unisolated_containers,
                sandbox_packages=sandbox_packages, log=logger,
            )
        )  # fmt: skip
    process = await start_stack(
        lambda seconds: NeMoGymStack(
            runtime, config_paths, policy_host=proxy.host, policy_port=proxy.port,
            start_timeout=seconds, judge=judge, ray=ray,
            allow_unisolated_containers=allow_unisolated_containers,
            sandbox_packages=sandbox_packages, sandboxes=StackSandboxes,
        ),
        start_timeout,
    )  # fmt: skip
    return PrivateStack(process)


async def describe_stack_url(
    stack_url: str | None,
    proxy_host: str,
    proxy_port: int,
    *,
    pin: str | None = None,
    token_file: Path | None = None,
) -> AttachedTarget | GateTarget | None:
    """The stack started elsewhere that `stack_url` names (None: none named), described
    before the model proxy starts: its `policy_address` is where the proxy must listen
    (`nemo.attached.describe_attached`; with `pin`, the TLS listener of a stack host,
    `shared.gate_client.describe_gate`: StackError, ConfigError)."""
    if stack_url is None:
        return None
    if pin is not None:
        return await describe_gate(stack_url, pin, token_file)
    return await describe_attached(stack_url, proxy_host, proxy_port)
