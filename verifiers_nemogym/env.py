"""NeMoGymEnv: gets a NeMo Gym stack for its env process and hands it to every rollout.

`start()` brings up the model proxy, then opens the `Stack` the taskset config asks for
(`stack_access.open_stack`) and hands its `/run` targets to the rollouts; a start that fails does
not raise (see `start`). `stop()` gives the stack up and stops the proxy, also after a failed start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import cast

import aiohttp
import verifiers.v1 as vf

from verifiers_nemogym import metrics
from verifiers_nemogym.bridge.proxy import NeMoGymModelProxy
from verifiers_nemogym.bridge.redact import NOTICE_LIMIT, cut
from verifiers_nemogym.containers.seam import sandbox_health
from verifiers_nemogym.context import RolloutContext
from verifiers_nemogym.errors import ConfigError, NeMoGymError
from verifiers_nemogym.nemo.ray_cluster import RayCluster
from verifiers_nemogym.stack_access import Stack, describe_stack_url, open_stack
from verifiers_nemogym.taskset import NeMoGymTaskset
from verifiers_nemogym.util import cancel_and_wait

logger = logging.getLogger(__name__)


class NeMoGymEnvConfig(vf.EnvConfig):
    """The single `agent` seat, pinned to the subprocess runtime: the harness only makes HTTP
    calls to the env's own loopback stack, so no container is needed."""

    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())
    """The policy under evaluation/training (`--env.agent.*`)."""


class NeMoGymEnv(vf.Env[NeMoGymEnvConfig]):
    """One agent seat playing NeMo Gym rows on the stack of its env process."""

    _proxy: NeMoGymModelProxy | None = None
    _stack: Stack | None = None
    _http: aiohttp.ClientSession | None = None
    _watchdog: asyncio.Task[None] | None = None

    @property
    def stack(self) -> Stack | None:
        """The stack rollouts use while started (`stack_access.Stack`), else None."""
        return self._stack

    @property
    def stack_marker(self) -> str | None:
        """The running stack's process marker (`VF_NEMOGYM_STACK=<marker>` in the environment
        of every NeMo Gym process of it); None when not started or started elsewhere."""
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
            text = str(e) if isinstance(e, NeMoGymError) else f"{type(e).__name__}: {e}"
            reason = cut(text, NOTICE_LIMIT)
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
        runtime = await asyncio.to_thread(lambda: taskset.nemo_venv)
        config_paths = await asyncio.to_thread(taskset.config_paths)
        health = None
        if config.stack_url is None:
            plan = await asyncio.to_thread(taskset.sandbox_plan, config_paths)
            # Rows whose container image is missing: one line now, not an error per rollout.
            await asyncio.to_thread(taskset.check_container_images, plan)
            # A stack elsewhere reads its provider's settings there, not from this process.
            health = sandbox_health(plan)
        reward_ranges = await asyncio.to_thread(taskset.reward_ranges, config_paths)
        logger.info(
            "NeMo Gym %s on Python %s%s (runtime %s)",
            runtime.nemo_gym_version,
            runtime.python_version,
            ", below the release's declared Python floor (opted in)" if runtime.below_floor else "",
            runtime.venv.name,
        )
        # A stack started elsewhere names the proxy's port (its `policy_model`).
        remote = await describe_stack_url(
            config.stack_url, config.proxy_host, config.proxy_port,
            pin=config.stack_pin, token_file=config.stack_token_file,
        )  # fmt: skip
        proxy_port = remote.policy_address[1] if remote is not None else config.proxy_port
        judge = config.judge.endpoint() if config.judge is not None else None
        ray = RayCluster.from_environ(config.ray_address) if config.ray_address else None
        self._proxy = NeMoGymModelProxy(host=config.proxy_host, port=proxy_port)
        try:
            await self._proxy.start()
        except OSError as e:
            raise ConfigError(
                f"model proxy cannot listen on {config.proxy_host}:{proxy_port} "
                f"({e.strerror}); choose another --env.taskset.proxy-port (0 picks a free one)"
            ) from None
        opened = time.monotonic()
        self._stack = await open_stack(
            runtime=runtime,
            config_paths=config_paths,
            proxy=self._proxy,
            remote=remote,
            shared=config.shared_stack,
            idle_timeout=config.stack_idle_grace,
            start_timeout=config.start_timeout,
            judge=judge,
            ray=ray,
            allow_unisolated_containers=config.allow_unisolated_containers,
            sandbox_packages=config.sandbox_packages,
        )
        what, where = self._stack.describe()
        logger.info(
            "%s in %.3f s (%s, %d agents; model proxy on %s)",
            what,
            time.monotonic() - opened,
            where,
            len(self._stack.run_urls),
            self._proxy.url,
        )
        self._http = self._stack.client_session()
        context = RolloutContext(
            proxy=self._proxy,
            run_urls=self._stack.run_urls,
            http=self._http,
            run_timeout=config.task.run_timeout,
            runtime=runtime.info,
            keep_ng_trajectory=config.keep_ng_trajectory,
            judge=self._stack.judge,
            reward_range=taskset.stated_range(),
            reward_ranges=reward_ranges,
            sandbox_health=health,
        )
        config.task._live = context
        self._watchdog = asyncio.create_task(_fail_when_lost(self._stack, context))
        logger.info(
            "nemo-gym-env ready in %.1f s (rows, proxy, stack): rollouts go to agents %s",
            time.monotonic() - began,
            sorted(self._stack.run_urls),
        )

    async def stop(self) -> None:
        """Take down what this process owns; safe after a failed or partial start, and twice."""
        cast(NeMoGymTaskset, self.taskset).config.task._live = None
        watchdog, self._watchdog = self._watchdog, None
        await cancel_and_wait(watchdog)
        try:
            if self._stack is not None and self._http is not None and not self._stack.lost.is_set():
                # A vf-eval run: NeMo Gym's aggregate metrics beside its traces, from this stack.
                await metrics.write_for_run(self._stack.run_urls, self._http)
            if self._stack is not None:
                stack, self._stack = self._stack, None
                if (summary := await stack.judge_summary()) is not None:
                    # Judge calls carry no rollout: the stack's counts are the run's record.
                    logger.info("judge on this stack: %s", summary)
                await stack.close()
        finally:
            if self._http is not None:
                http, self._http = self._http, None
                await http.close()
            if self._proxy is not None:
                proxy, self._proxy = self._proxy, None
                await proxy.stop()


async def _fail_when_lost(stack: Stack, context: RolloutContext) -> None:
    """The one watchdog: once the stack is lost (each backend watches its own kind of stack),
    every rollout in flight or to come fails fast with the reason."""
    reason = await stack.lost.wait()
    logger.error("NeMo Gym stack lost; remaining rollouts fail: %s", cut(reason, NOTICE_LIMIT))
    context.fail(reason)
