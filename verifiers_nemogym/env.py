"""NeMoGymEnv: gets a NeMo Gym stack for its env process and hands it to every rollout.

`start()` brings up the model proxy, then attaches to the machine's shared stack for the
taskset's environments (starting it if none runs; see nemo/shared.py), or with
`shared_stack=False` starts a private stack with the proxy registered as `policy_model`.
`stop()` takes down what this process owns and releases its lease (also after a failed or
partial start). Everything else is verifiers' single-agent env.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import cast

import aiohttp
import verifiers.v1 as vf

from verifiers_nemogym.bridge.proxy import NeMoGymModelProxy
from verifiers_nemogym.bridge.redact import redact
from verifiers_nemogym.errors import ConfigError, NeMoGymError, StackError
from verifiers_nemogym.live import LiveStack
from verifiers_nemogym.nemo.remote import RemoteStack, describe_remote, watch_remote
from verifiers_nemogym.nemo.shared import Lease, attach_or_start
from verifiers_nemogym.nemo.stack import NeMoGymStack
from verifiers_nemogym.taskset import NeMoGymTaskset

logger = logging.getLogger(__name__)


class NeMoGymEnvConfig(vf.EnvConfig):
    """The single `agent` seat, pinned to the subprocess runtime: the harness only makes HTTP
    calls to the env's own loopback stack, so no container is needed."""

    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())
    """The policy under evaluation/training (`--env.agent.*`)."""


class NeMoGymEnv(vf.Env[NeMoGymEnvConfig]):
    """One agent seat playing NeMo Gym rows on a stack this env process owns."""

    _proxy: NeMoGymModelProxy | None = None
    _stack: NeMoGymStack | None = None
    _lease: Lease | None = None
    _http: aiohttp.ClientSession | None = None
    _watchdog: asyncio.Task[None] | None = None

    @property
    def stack_marker(self) -> str | None:
        """The running stack's process marker (`VF_NEMOGYM_STACK=<marker>` in the environment
        of every NeMo Gym process of it), shared or private; None when not started."""
        if self._lease is not None:
            return self._lease.marker
        return self._stack.marker if self._stack is not None else None

    @property
    def start_error(self) -> str | None:
        """Why the last `start()` could not bring the stack up (every rollout fails with it),
        or None."""
        return cast(NeMoGymTaskset, self.taskset).config.task._start_error

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        await agents.agent.run(task)

    async def start(self) -> None:
        """Bring up the proxy and the stack. A failure does not raise: verifiers' env-server
        workers die on an exception here and their callers then wait forever (verifiers
        0.4.0-0.4.1.dev86, prime-rl's launcher), so the reason is logged, what started is
        stopped, and every rollout of this process fails with it instead."""
        task_config = cast(NeMoGymTaskset, self.taskset).config.task
        task_config._start_error = None
        try:
            await self._start()
        except Exception as e:
            reason = redact(str(e) if isinstance(e, NeMoGymError) else f"{type(e).__name__}: {e}")
            logger.error(
                "nemo-gym-env could not start its NeMo Gym stack; every rollout of this env "
                "process fails with: %s",
                reason,
            )
            await self.stop()
            task_config._start_error = reason

    async def _start(self) -> None:
        taskset = cast(NeMoGymTaskset, self.taskset)
        config = taskset.config
        began = time.monotonic()
        # Input was checked where the taskset loaded; the runtime is built here, where
        # rollouts run (an env server's worker, or vf-eval's process).
        venv = await asyncio.to_thread(lambda: taskset.nemo_venv)
        config_paths = await asyncio.to_thread(taskset.config_paths)
        logger.info(
            "NeMo Gym %s on Python %s%s (runtime %s)",
            venv.nemo_gym_version,
            venv.python_version,
            ", below the release's declared Python floor (opted in)" if venv.below_floor else "",
            venv.venv.name,
        )
        remote: RemoteStack | None = None
        proxy_port = config.proxy_port
        if config.stack_url is not None:
            remote = await describe_remote(config.stack_url, config.proxy_host, proxy_port)
            proxy_port = remote.policy_address[1]
        self._proxy = NeMoGymModelProxy(host=config.proxy_host, port=proxy_port)
        try:
            await self._proxy.start()
        except OSError as e:
            raise ConfigError(
                f"model proxy cannot listen on {config.proxy_host}:{proxy_port} "
                f"({e.strerror}); choose another --env.taskset.proxy-port (0 picks a free one)"
            ) from None
        if remote is not None:
            logger.info(
                "attached to the NeMo Gym stack at %s (model proxy on %s)",
                remote.head_url,
                self._proxy.url,
            )
            agents = dict(remote.run_urls)
        elif config.shared_stack:
            attach_began = time.monotonic()
            self._lease = await attach_or_start(
                taskset.nemo_venv,
                config_paths,
                proxy_url=self._proxy.url,
                proxy_secret=self._proxy.secret,
                idle_timeout=config.stack_idle_grace,
                start_timeout=config.start_timeout,
                log=logger,
            )
            logger.info(
                "%s shared NeMo Gym stack in %.3f s (host pid %d, head %s, %d agents)",
                "NeMo Gym stack ready: started" if self._lease.started else "attached to",
                time.monotonic() - attach_began,
                self._lease.host_pid,
                self._lease.head_url,
                len(self._lease.agents),
            )
            agents = dict(self._lease.agents)
        else:
            self._stack = NeMoGymStack(
                taskset.nemo_venv,
                config_paths,
                policy_host=self._proxy.host,
                policy_port=self._proxy.port,
                start_timeout=config.start_timeout,
            )
            await self._stack.start()
            # Rollouts post `/run` where NeMo Gym's own collection does (an environment server
            # fronting the agent on NeMo Gym >= 0.7, else the agent).
            agents = dict(self._stack.run_urls)
        # No cookie jar: NeMo Gym keys agent sessions by cookie, and each /run is its own session.
        self._http = aiohttp.ClientSession(
            cookie_jar=aiohttp.DummyCookieJar(),
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None),
        )
        live = LiveStack(
            proxy=self._proxy,
            agents=agents,
            http=self._http,
            run_timeout=config.task.run_timeout,
            runtime=taskset.nemo_venv.info,
            keep_ng_trajectory=config.keep_ng_trajectory,
        )
        config.task._live = live
        if remote is not None:
            self._watchdog = asyncio.create_task(watch_remote(remote, live))
        elif self._lease is not None:
            self._watchdog = asyncio.create_task(_watch_lease(self._lease, live))
        else:
            assert self._stack is not None
            self._watchdog = asyncio.create_task(_watch(self._stack, live))
        logger.info(
            "nemo-gym-env ready in %.1f s (rows, proxy, stack): rollouts go to agents %s",
            time.monotonic() - began,
            sorted(agents),
        )

    async def stop(self) -> None:
        """Take down what this process owns; safe after a failed or partial start, and twice."""
        cast(NeMoGymTaskset, self.taskset).config.task._live = None
        if self._watchdog is not None:
            watchdog, self._watchdog = self._watchdog, None
            watchdog.cancel()
            await asyncio.gather(watchdog, return_exceptions=True)
        try:
            if self._lease is not None:
                lease, self._lease = self._lease, None
                await lease.close()
            if self._stack is not None:
                stack, self._stack = self._stack, None
                await stack.stop()
        finally:
            if self._http is not None:
                http, self._http = self._http, None
                await http.close()
            if self._proxy is not None:
                proxy, self._proxy = self._proxy, None
                await proxy.stop()


WATCH_INTERVAL = 2.0
"""Seconds between liveness checks of a running stack."""


async def _watch(stack: NeMoGymStack, live: LiveStack) -> None:
    """Check the stack until it dies, then fail it: a dead server is reported once, and every
    rollout fails fast with the reason. The stack is not restarted: a server that died mid-run
    (out of memory, a crash) would most likely die again, and a restart would hide it."""
    while True:
        await asyncio.sleep(WATCH_INTERVAL)
        try:
            await stack.check_alive()
        except StackError as e:
            logger.error("NeMo Gym stack died; remaining rollouts fail: %s", e)
            live.fail(str(e))
            return


async def _watch_lease(lease: Lease, live: LiveStack) -> None:
    """Fail every rollout once the shared stack's host is gone (the stack died, `stack down`,
    the host was killed): the lease connection closes, and the host's last word is the reason."""
    await lease.lost.wait()
    logger.error("shared NeMo Gym stack lost; remaining rollouts fail: %s", lease.reason)
    live.fail(lease.reason)
