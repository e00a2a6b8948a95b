"""One NeMo Gym server stack (`ng_run`, or `gym env start` where the release has it, from the
runtime venv) whose policy model is our proxy.

`await start()` returns once every server answers and NeMo Gym reported them ready, or raises
StackError with nothing left running; `agents` and `run_urls` (`catalog.run_targets`) then say
where rollouts go. `await stop()` is idempotent and takes the whole process tree down; if the
owner dies instead, the supervisor does. Stacks share no state in this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import aiohttp
import yaml

from verifiers_nemogym.errors import StackError
from verifiers_nemogym.judge.blame import JudgeFailure
from verifiers_nemogym.judge.endpoint import Judge
from verifiers_nemogym.judge.relay import JudgeRelay
from verifiers_nemogym.nemo.agent_clis import (
    cli_env,
    harness_agents,
    harness_config,
    install_clis,
    policy_keys,
)
from verifiers_nemogym.nemo.catalog import (
    AGENTS,
    POLICY_INSTANCE,
    RESOURCES_SERVERS,
    Catalog,
    placeholder_server_venv,
    run_targets,
    server_blocks,
    server_urls,
    write_policy_placeholder,
)
from verifiers_nemogym.nemo.head import fetch_merged_config
from verifiers_nemogym.nemo.judges import active, judge_refs, write_judge_config
from verifiers_nemogym.nemo.ng_log import NgRunLog, also_down
from verifiers_nemogym.nemo.ray_cluster import RayCluster, check_cluster, private_ray_auth
from verifiers_nemogym.nemo.release import features
from verifiers_nemogym.nemo.sandboxes import SandboxesFactory, StackSandboxes, Unprepared
from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR, processes_with_env, signal_with_env
from verifiers_nemogym.nemo.venv import (
    RAY_TMPDIR_PREFIX,
    WORKDIR_LOCK,
    WORKDIR_PREFIX,
    NeMoGymVenv,
    WarmStart,
    prune_stale_workdirs,
)
from verifiers_nemogym.net import free_port
from verifiers_nemogym.util import poll_until, try_flock, uv_cache_dir

logger = logging.getLogger(__name__)


_SUPERVISOR = Path(__file__).with_name("supervisor.py")
# How long `check_alive` waits for NeMo Gym to name the server that died when the log cannot
# tell yet (NeMo Gym notices a death at its next poll, and prints the line once it exits).
_DIED_LINE_WAIT = 5.0
_PROGRESS_EVERY = 5.0
CHECK_ALIVE_INTERVAL = 2.0
"""Seconds between the `check_alive` calls of a stack's owner (or a shared stack's host)."""
# supervisor.py needs up to ~10 s graceful + 3 s SIGTERM + 5 s SIGKILL.
_STOP_TIMEOUT = 30.0


def _hydra_quote(text: str) -> str:
    """A quoted hydra string: one value whatever it holds (commas, brackets, colons)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _hydra_list(paths: list[Path]) -> str:
    """A hydra list literal; quoted so paths with commas or spaces stay one element."""
    return "[" + ",".join(_hydra_quote(str(p)) for p in paths) + "]"


WORKER_HEALTHCHECK, WORKER_HEALTHCHECK_S = "uvicorn_timeout_worker_healthcheck", 600
"""NeMo Gym's (0.6+) key for the seconds a server's worker may miss uvicorn's ping before it is
killed and replaced (its default 30), and ours; a user's config that sets it is kept."""
RAY_NODE_TIMEOUT = "The current node timed out during startup"
"""Ray's error when the raylet does not register with its GCS within Ray's fixed 30 s
(`RAY_NODE_WAIT`; no setting changes it): load on the machine, not the stack's config."""
RAY_NODE_WAIT = 30.0
"""Seconds Ray waits for its node (hard-coded in Ray's `_private/node.py`)."""
HEAD_PORT_TAKEN = "NeMo Gym's head server could not bind its port"
"""The first line of the error of a start whose head port another process bound between our
choice (`free_port`) and ng_run's bind: NeMo Gym's head server then never listens while ng_run
waits for it forever, so the start fails at once (`NgRunLog.bind_failure`)."""
START_ATTEMPTS = 3
"""Starts `start_stack` makes in all while a start fails for a `retry_cause`, before its error
stands."""


def _first_line(error: BaseException) -> str | None:
    """A StackError's first line (ng_run's exit and its cause; a server's death, a taken head
    port or the start deadline put their own there); None for any other error. A log tail below
    may quote anything."""
    return str(error).split("\n", 1)[0] if isinstance(error, StackError) else None


def ray_node_timed_out(error: BaseException) -> bool:
    """Whether a failed start's `error` is Ray's node timeout and nothing else: a StackError
    whose first line quotes `RAY_NODE_TIMEOUT`."""
    return RAY_NODE_TIMEOUT in (_first_line(error) or "")


def retry_cause(error: BaseException) -> str | None:
    """Why a failed start's `error` is worth a fresh stack (the machine's state at that moment,
    not the stack's config), for the warning; None for every other error."""
    if ray_node_timed_out(error):
        return (
            f"Ray's node timed out during startup (the machine's load: Ray waits "
            f"{RAY_NODE_WAIT:.0f} s for its node)"
        )
    if HEAD_PORT_TAKEN in (_first_line(error) or ""):
        return "another process bound the head server's port before NeMo Gym did"
    return None


def retry_start(error: BaseException, attempt: int, remaining: float) -> bool:
    """Whether the `attempt`-th (from 1) start of one `start_stack`, failed with `error`
    `remaining` s before its deadline, is tried again: only for a `retry_cause`, before
    `START_ATTEMPTS`, with more than `RAY_NODE_WAIT` s left (less could not outlast Ray's wait)."""
    return retry_cause(error) is not None and attempt < START_ATTEMPTS and remaining > RAY_NODE_WAIT


async def start_stack(
    make: Callable[[float], NeMoGymStack], start_timeout: float, log: logging.Logger = logger
) -> NeMoGymStack:
    """A started stack from `make(seconds)` (a fresh `NeMoGymStack` whose `start_timeout` is
    `seconds`), every start path's one way to start one: tried again with a fresh stack, with a
    warning, while `retry_start` allows, all within `start_timeout` s; else the error stands.
    Nothing of a failed attempt survives (the folder it kept for its log goes at the retry)."""
    deadline = time.monotonic() + start_timeout
    attempt = 1
    while True:
        stack = make(deadline - time.monotonic())
        try:
            await stack.start()
            return stack
        except StackError as e:
            if not retry_start(e, attempt, deadline - time.monotonic()):
                raise
            stack.discard_workdir()
            log.warning(
                "NeMo Gym stack start %d/%d failed because %s; starting a fresh stack",
                attempt,
                START_ATTEMPTS,
                retry_cause(e),
            )
        attempt += 1


class NeMoGymStack:
    """NeMo Gym servers for `config_paths`, with `policy_model` served by the proxy at
    `policy_host:policy_port` (which must answer `GET /` and `POST /v1/responses`). With a
    `judge`, every judge reference of the configs is served by that judge through a relay this
    stack runs (`judge/relay.py`, checked at start; the judge's key never reaches NeMo Gym).
    With `ray`, NeMo Gym's servers join that Ray cluster (`nemo/ray_cluster.py`, checked first,
    before anything starts) instead of the stack's private Ray. The sandboxes its servers start
    are prepared by what `sandboxes` makes (`nemo/sandboxes.py`; the package's is
    `containers.seam.StackSandboxes`); without it, configs that start sandboxes are refused.
    Sandboxes the package cannot isolate are refused unless `allow_unisolated_containers`.
    `sandbox_packages` (`containers.sandbox.check_sandbox_packages`' lines): added to the venvs
    of the servers that start sandboxes; the stack's server venvs are then a set of their own
    (`NeMoGymVenv.server_venvs_for`)."""

    def __init__(
        self,
        venv: NeMoGymVenv,
        config_paths: list[Path],
        *,
        policy_host: str,
        policy_port: int,
        workdir: Path | None = None,
        start_timeout: float = 600,
        fast_start: bool = True,
        judge: Judge | None = None,
        on_judge_failure: Callable[[JudgeFailure], None] | None = None,
        ray: RayCluster | None = None,
        allow_unisolated_containers: bool = False,
        sandbox_packages: Sequence[str] = (),
        sandboxes: SandboxesFactory | None = None,
        log: logging.Logger = logger,
    ) -> None:
        if not config_paths:
            raise StackError("a NeMo Gym stack needs at least one config path")
        self.venv = venv
        self.config_paths = [Path(p).absolute() for p in config_paths]
        self.policy_host = policy_host
        self.policy_port = policy_port
        self.start_timeout = start_timeout
        self.fast_start = fast_start
        """Return once every server answers, and keep Ray from pre-starting idle workers
        (docs/performance.md); False runs `ng_run` exactly as NeMo Gym does alone."""
        self.log = log
        self.ray = ray
        """The user's Ray cluster NeMo Gym's servers join (None: a private Ray)."""
        self.judge = judge
        self.relay: JudgeRelay | None = (
            JudgeRelay(judge, on_failure=on_judge_failure) if judge else None
        )
        """The judge relay while started (its `stats` and `status`), when there is a judge."""
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else None
        self.marker = uuid.uuid4().hex
        self.agents: dict[str, str] = {}
        self.run_urls: dict[str, str] = {}
        """Agent instance name -> base URL of the server its rollouts' `POST /run` goes to
        (`catalog.run_targets`)."""
        self.head_url = ""
        self.head_port = 0
        self.features = features(venv.nemo_gym_version)
        self.servers: dict[str, str] = {}
        """Every NeMo Gym server instance name -> base URL (including policy_model)."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._ray_tmpdir: Path | None = None
        self.server_venvs = venv.server_venvs_for(sandbox_packages)
        """Where NeMo Gym builds this stack's server venvs (`+uv_venv_dir`)."""
        self.warm_start = WarmStart(
            self.server_venvs, self.config_paths, judge.api if judge is not None else None
        )
        self._workdir_lock: IO[str] | None = None
        self._ray_tmpdir_lock: IO[str] | None = None
        self._warm = False
        self.ng_log = NgRunLog(self.workdir / "ng_run.log" if self.workdir else None)
        """ng_run's log (its servers' lines too): readiness, and what died and why."""
        self._started = False
        self._failed = False
        self._merged: list[dict[str, Any]] | None = None
        policy = f"http://{policy_host}:{policy_port}"
        self.containers: StackSandboxes = (
            sandboxes(
                self.marker,
                policy,
                log,
                allow_unisolated=allow_unisolated_containers,
                packages=sandbox_packages,
            )
            if sandboxes is not None
            else Unprepared()
        )

    @property
    def log_path(self) -> Path:
        assert self.workdir is not None, "the stack has not been started"
        return self.workdir / "ng_run.log"

    # ----------------------------------------------------------------------------- start

    async def start(self) -> None:
        if self._proc is not None:
            raise StackError("this NeMo Gym stack was already started")
        started = time.monotonic()
        try:
            await self._start(started)
        except BaseException as exc:
            # Cancellation and Ctrl-C included: nothing may outlive a failed start.
            self._failed = True
            # Ray's node timing out is ng_run's first step, before NeMo Gym touches any server
            # venv: the stamp stays, and a start tried again (`start_stack`) stays warm.
            if self._warm and isinstance(exc, Exception) and not ray_node_timed_out(exc):
                # Server venvs are shared between sets: one another set's interrupted start
                # left half-built is repaired only by a cold start (docs/runtime.md).
                self.warm_start.stamp.unlink(missing_ok=True)
                self.log.info("NeMo Gym warm start failed; the next start re-checks server venvs")
            await self.stop()
            raise
        self._started = True
        self.log.info(
            "NeMo Gym stack ready in %.1f s: %s", time.monotonic() - started, ", ".join(self.agents)
        )

    async def _start(self, started: float) -> None:
        deadline = started + self.start_timeout
        # Ray puts unix sockets below its temp dir (path limit ~107 chars): keep it short.
        # mkdtemp makes it 0700: Ray's sockets, session logs and the stack's Ray token
        # (`private_ray_auth`, or a joined cluster's token given by value) are this user's alone.
        # What stacks killed whole (owner and supervisor at once) left, a day later.
        await asyncio.to_thread(prune_stale_workdirs, Path("/tmp"), prefix=RAY_TMPDIR_PREFIX)
        self._ray_tmpdir = Path(tempfile.mkdtemp(prefix=RAY_TMPDIR_PREFIX, dir="/tmp"))
        self._ray_tmpdir_lock = try_flock(self._ray_tmpdir / WORKDIR_LOCK)
        # The stack's processes (NeMo Gym's servers and the CLIs they run) get a temp folder
        # of their own, gone with the stack (stop, or the supervisor of a dead owner): OpenCode,
        # for one, unpacks a 5 MB library into $TMPDIR at every run and never deletes it.
        (private_tmp := self._ray_tmpdir / "tmp").mkdir()
        base_env = self.venv.env(self._ray_tmpdir) | {"TMPDIR": str(private_tmp)}
        if self.ray is not None:
            # First: an address that does not answer, or a cluster that refuses us, is one
            # line before anything of the stack exists.
            await check_cluster(self.venv.bin("python"), self.ray, base_env, self._ray_tmpdir)
            ray_env = self.ray.env(base_env, self._ray_tmpdir)
        else:
            ray_env = base_env | private_ray_auth(self._ray_tmpdir)
        if self.workdir is None:
            await asyncio.to_thread(prune_stale_workdirs, Path(tempfile.gettempdir()))
            self.workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
            self.ng_log = NgRunLog(self.log_path)
            self._workdir_lock = try_flock(self.workdir / WORKDIR_LOCK)
        self.workdir.mkdir(parents=True, exist_ok=True)
        policy_url = f"http://{self.policy_host}:{self.policy_port}/v1"
        policy_config = write_policy_placeholder(
            self.workdir, self.policy_host, self.policy_port, policy_keys(policy_url)
        )
        extra = [policy_config]
        if self.relay is not None:
            extra.append(await self._start_judge())
        cli_folders, harness = await self._prepare_harnesses(deadline)
        if harness:
            extra.append(harness)
        if containers := await self._prepare_containers():
            extra.append(containers)
        await self.warm_start.lock_if_cold(deadline, self.log)
        # Cold: NeMo Gym builds or repairs every server venv. `skip_venv_if_present` would start
        # a server once another sharing its venv had created it, before its packages were in
        # (`No module named fastapi`), and reuse venvs an interrupted start left half-built.
        warm = self._warm = self.warm_start.stamp.exists()
        placeholder_venv = placeholder_server_venv(self.server_venvs)
        if not warm and placeholder_venv.is_symlink():
            placeholder_venv.unlink()  # older releases linked it to the runtime venv

        head_port = self.head_port = free_port()
        self.head_url = f"http://127.0.0.1:{head_port}"
        # In a thread: building the command may run NeMo Gym's config resolver (seconds) the
        # first time a config set is seen (`_model_type_restrictions`).
        command = await asyncio.to_thread(
            self.command, extra, head_port, warm=warm, deadline=deadline
        )
        self._spawn(command, ray_env, cli_folders, bool(harness))
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await self._wait_ready(session, started, deadline)
        # The merged config as NeMo Gym resolved it (includes, inheritance, generated servers),
        # read the way a stack attached by URL is read (remote.py).
        config = await fetch_merged_config(self.head_url)
        self.agents = server_urls(config, AGENTS)
        self.run_urls = run_targets(config)
        if not self.agents:
            raise StackError(
                f"NeMo Gym started but its config defines no agent server "
                f"({', '.join(map(str, self.config_paths))})"
            )
        self.warm_start.mark_warm()

    def _spawn(
        self, command: list[str], env: dict[str, str], cli_folders: list[Path], harness: bool
    ) -> None:
        """Start `command` in the workdir under the supervisor, its output in the log, with `env`
        (the runtime's, with the stack's Ray) less the judge's key, `cli_folders` first on PATH."""
        assert self.workdir is not None and self._ray_tmpdir is not None
        if self.judge is not None:
            env = self.judge.scrubbed(env)  # the relay holds the key; NeMo Gym never does
        if cli_folders or harness:
            # The CLIs we installed come first (NeMo Gym's install check then finds them); no
            # CLI updates itself, and a `npm install -g` one runs lands in this stack's folder,
            # never in the user's global prefix or our cache.
            env["PATH"] = os.pathsep.join([*map(str, cli_folders), env["PATH"]])
            env.update(cli_env())
            env["NPM_CONFIG_PREFIX"] = str(self.workdir / "npm-global")
        if self.fast_start:
            # Ray otherwise spawns idle Python workers (one per CPU) when the first driver
            # connects; NeMo Gym's drivers start workers on demand if they ever run a task.
            env["RAY_prestart_worker_first_driver"] = "0"
        self.log_path.touch()
        orphan_cleanup = [str(self._ray_tmpdir)]
        if self._own_workdir:
            orphan_cleanup.append(str(self.workdir))
        self._proc = subprocess.Popen(
            [sys.executable, "-I", str(_SUPERVISOR), "--marker", self.marker,
             "--log", str(self.log_path), "--cwd", str(self.workdir),
             *(arg for folder in orphan_cleanup for arg in ("--remove-if-orphaned", folder)),
             *self.containers.supervisor_args(),
             "--", *command],
            cwd=self.workdir,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Own session: a terminal Ctrl-C goes to our owner, which then stops us in order.
            start_new_session=True,
        )  # fmt: skip
        self.log.info(
            "starting NeMo Gym stack (%s; nemo-gym-%s on Python %s, `%s`), log: %s",
            ", ".join(p.name for p in self.config_paths),
            self.venv.nemo_gym_version,
            self.venv.python_version,
            " ".join([Path(command[0]).name, *command[1 : 3 if self.features.gym_cli else 1]]),
            self.log_path,
        )

    async def _prepare_harnesses(self, deadline: float) -> tuple[list[Path], Path | None]:
        """Install the CLIs of coding-agent harnesses (`nemo.agent_clis`; cached) and write the
        config routing their calls per rollout: the CLIs' folders and that config, or None."""
        agents = harness_agents(await asyncio.to_thread(self._merged_configs))
        if not agents:
            return [], None
        self.log.info(
            "coding-agent harnesses: %s",
            ", ".join(f"{a.instance} ({a.cli.package}@{a.version})" for a in agents),
        )
        folders = await asyncio.to_thread(install_clis, agents, deadline, self.log)
        assert self.workdir is not None
        path = self.workdir / "vf_nemogym_harnesses.yaml"
        config = harness_config(agents, self.workdir / "model-calls")
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return folders, path

    async def _prepare_containers(self) -> Path | None:
        """The config for servers that start sandboxes (`StackSandboxes`), None without."""
        assert self.workdir is not None
        merged = await asyncio.to_thread(self._merged_configs)
        return await self.containers.prepare(merged, self.venv, self.workdir)

    async def _start_judge(self) -> Path:
        """Start the judge relay, check the judge answers, and write the judge config."""
        assert self.relay is not None and self.judge is not None and self.workdir is not None
        await self.relay.start()
        await self.relay.preflight()
        merged = await asyncio.to_thread(self._merged_configs)
        refs = active([r for m in merged for r in judge_refs(m)], self.judge.enable_optional)
        self.log.info(
            "judge %s serves %s (relay %s)",
            self.judge.describe(),
            ", ".join(sorted({r.server for r in refs})) or "no judge reference",
            self.relay.base_url,
        )
        return write_judge_config(
            self.workdir,
            refs,
            api=self.judge.api,
            base_url=self.relay.base_url,
            token=self.relay.token,
            model=self.judge.model,
            defined={str(name) for m in merged for name in m},
        )

    def command(
        self, extra_configs: list[Path], head_port: int, *, warm: bool, deadline: float
    ) -> list[str]:
        """The NeMo Gym start command for this stack (`extra_configs`: ours, listed after the
        user's so they win; `deadline`: `time.monotonic()` value)."""
        has = self.features
        # `ng_run` became a deprecated shim for `gym env start` (same overrides).
        start = ["gym", "env", "start"] if has.gym_cli else ["ng_run"]
        command = [
            str(self.venv.bin(start[0])),
            *start[1:],
            f"+config_paths={_hydra_list([*self.config_paths, *extra_configs])}",
            "+head_server.host=127.0.0.1",
            f"+head_server.port={head_port}",
            # NeMo Gym's default is already loopback unless use_absolute_ip; say so explicitly.
            "+default_host=127.0.0.1",
            f"+uv_venv_dir={self.server_venvs}",
            f"+skip_venv_if_present={str(warm).lower()}",
            f"+uv_cache_dir={uv_cache_dir()}",
        ]
        if self.ray is not None:
            # NeMo Gym's head and every server then `ray.init` this address (0.4-0.7).
            command.append(f"+ray_head_node_address={_hydra_quote(self.ray.address)}")
        if has.spinup_timeout:
            # NeMo Gym's own start deadline (default 600 s) would otherwise cut ours short, or
            # outlive it: give it what is left of ours, so both end the start at the same time.
            left = max(1, int(deadline - time.monotonic()) + 1)
            command.append(f"+server_spinup_timeout_seconds={left}")
        if has.worker_healthcheck and not any(
            WORKER_HEALTHCHECK in config for config in self._merged_configs()
        ):
            # A worker still importing (~6 CPU-s) on a loaded machine misses the 30 s; each
            # restart loads it more, and a /run in flight dies with its worker. A hung worker
            # is the rollout deadline's to catch.
            command.append(f"+{WORKER_HEALTHCHECK}={WORKER_HEALTHCHECK_S}")
        if has.pairing_check and (restricted := self._model_type_restrictions()):
            # Our placeholder is no model adapter NeMo Gym knows (it only points agents at the
            # proxy), so NeMo Gym would refuse to start. The proxy relays Responses calls
            # unchanged to verifiers' model: whatever an allowed adapter would translate (e.g.
            # audio in metadata) is the user's model's to handle. Said, not hidden.
            self.log.warning(
                "resources servers accept only some model adapters (%s); the policy is "
                "verifiers' model behind the proxy, which translates nothing, so NeMo Gym's "
                "pairing check is waived (+allow_unsupported_pairing=true)",
                "; ".join(f"{name}: {', '.join(types)}" for name, types in restricted.items()),
            )
            command.append("+allow_unsupported_pairing=true")
        return command

    def _merged_configs(self) -> list[dict[str, Any]]:
        """Each of our configs as NeMo Gym merges it (`Catalog.merged_config`), read once."""
        if self._merged is None:
            catalog = Catalog(self.venv)
            self._merged = [catalog.merged_config(path) for path in self.config_paths]
        return self._merged

    def _model_type_restrictions(self) -> dict[str, list[str]]:
        """Resources servers of our configs that declare `allowed_model_types`, with them, as
        NeMo Gym merges the configs (from an included config or an inherited block too)."""
        found: dict[str, list[str]] = {}
        for merged in self._merged_configs():
            for name, (_, settings) in server_blocks(merged, RESOURCES_SERVERS).items():
                if allowed := settings.get("allowed_model_types"):
                    found[name] = [allowed] if isinstance(allowed, str) else list(map(str, allowed))
        return dict(sorted(found.items()))

    async def _wait_ready(
        self, session: aiohttp.ClientSession, started: float, deadline: float
    ) -> None:
        instances: list[dict[str, Any]] = []
        up: set[str] = set()
        ready_line = False
        last_progress = started
        while True:
            if (code := self._proc.poll() if self._proc else None) is not None:
                raise StackError(self.ng_log.death_message(code))
            if not instances:
                found = await self._get_json(session, f"{self.head_url}/server_instances")
                if found is None and (taken := self.ng_log.bind_failure(self.head_port)):
                    raise StackError(f"{HEAD_PORT_TAKEN} 127.0.0.1:{self.head_port}: {taken}")
                instances = found or []
                self.servers = {
                    str(i["process_name"]): str(i["url"]) for i in instances if i.get("url")
                }
            for name, url in self.servers.items():
                if name not in up and await self._answers(session, url):
                    up.add(name)
            ready_line = ready_line or await self._head_ready(session)
            # NeMo Gym only notices at its next 3 s poll what our 0.5 s poll already saw.
            if (ready_line or self.fast_start) and self.servers and up == set(self.servers):
                return
            now = time.monotonic()
            if now > deadline:
                raise StackError(
                    f"NeMo Gym stack not ready after {self.start_timeout:.0f} s "
                    f"({self._progress(up)}).\n{self.ng_log.tail_for(set(self.servers) - up)}"
                )
            if now - last_progress >= _PROGRESS_EVERY:
                last_progress = now
                self.log.info("NeMo Gym stack: %s, %.0f s", self._progress(up), now - started)
            await asyncio.sleep(0.5)

    async def _head_ready(self, session: aiohttp.ClientSession) -> bool:
        """Whether NeMo Gym itself found every server ready: the head server's `/readyz` where
        the release has it, else its ready line in the log."""
        if self.features.readyz:
            try:
                async with session.get(f"{self.head_url}/readyz") as response:
                    await response.read()
                    return response.status == 200
            except (aiohttp.ClientError, TimeoutError):
                return False
        return self.ng_log.saw_ready_line()

    def _progress(self, up: set[str]) -> str:
        if not self.servers:
            return "head server not up yet"
        waiting = sorted(set(self.servers) - up)
        text = f"{len(up)}/{len(self.servers)} servers up"
        return text + (f", waiting for {', '.join(waiting)}" if waiting else ", waiting for ng_run")

    async def _get_json(self, session: aiohttp.ClientSession, url: str) -> Any:
        try:
            async with session.get(url) as response:
                if response.status != 200:
                    return None
                return await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def _answers(self, session: aiohttp.ClientSession, url: str) -> bool | None:
        """True on any HTTP answer (NeMo Gym's poll ignores the status too), False when nothing
        listens at `url`, None when slow (no death: a busy server may outlast the timeout)."""
        try:
            async with session.get(url) as response:
                await response.read()
                return True
        except aiohttp.ClientConnectorError:
            return False
        except (aiohttp.ClientError, TimeoutError):
            return None

    # ----------------------------------------------------------------------------- health

    async def check_alive(self) -> None:
        """Raise StackError naming the server that died first (or ng_run itself), if one did.

        NeMo Gym stops all servers once one died, so several may refuse connections. The one
        named is NeMo Gym's ("Process `x` finished unexpectedly"); before that line, the only
        refusing server whose log shows no graceful shutdown; if neither tells, after waiting
        up to _DIED_LINE_WAIT s for either, the first refusing server that did not shut down
        gracefully, else the first refusing one. The message lists the others found down."""
        if self._proc is None or not self._started:
            raise StackError("the NeMo Gym stack is not running")
        if (code := self._proc.poll()) is not None:
            raise StackError(self.ng_log.death_message(code))
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            # Every server, not just up to the first that refuses: which one died first is
            # decided below, not by the order the servers are checked in.
            refusing = [
                name
                for name, url in self.servers.items()
                # The policy is the proxy of our owner, not part of the stack.
                if name != POLICY_INSTANCE and await self._answers(session, url) is False
            ]
        if not refusing:
            return
        proc = self._proc
        await poll_until(
            lambda: proc.poll() is not None or self._log_tells_first_dead(refusing),
            time.monotonic() + _DIED_LINE_WAIT,
            0.25,
        )
        if (code := proc.poll()) is not None:
            raise StackError(self.ng_log.death_message(code))
        if (name := self.ng_log.died_first()) is not None:
            raise StackError(
                f"NeMo Gym server {name!r} died (NeMo Gym: process finished unexpectedly)"
                f"{also_down(refusing, name)}; its log:\n{self.ng_log.server_tail(name, 20)}"
            )
        died = [n for n in refusing if not self.ng_log.shut_down_normally(n)]
        name = (died or refusing)[0]
        raise StackError(
            f"NeMo Gym server {name!r} at {self.servers[name]} refuses connections"
            f"{also_down(refusing, name)}; log tail:\n{self.ng_log.server_tail(name, 20)}"
        )

    def _log_tells_first_dead(self, refusing: list[str]) -> bool:
        """Whether the log names the first server to die: NeMo Gym's line, or exactly one of
        the `refusing` servers without a graceful shutdown (see `check_alive`)."""
        if self.ng_log.died_first() is not None:
            return True
        return sum(not self.ng_log.shut_down_normally(n) for n in refusing) == 1

    # ----------------------------------------------------------------------------- stop

    def _request_stop(self) -> None:
        """Synchronous first step of stop(), so even a cancelled stop() starts the teardown."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        # Also signal: a forked copy of the pipe in some other process would hide the EOF.
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)

    async def stop(self) -> None:
        """Stop everything this stack started. Safe to call twice or after a failed start."""
        if self._started and self.fast_start:
            # Signalled before its ready line, ng_run skips its graceful shutdown of the servers
            # (the teardown would still kill them): give it its last readiness poll.
            proc = self._proc
            await poll_until(
                lambda: proc is None or proc.poll() is not None or self.ng_log.saw_ready_line(),
                time.monotonic() + 4,
                0.1,
            )
        self._request_stop()
        proc = self._proc
        if proc is not None:
            await poll_until(lambda: proc.poll() is not None, time.monotonic() + _STOP_TIMEOUT, 0.1)
            if proc.poll() is None:
                self.log.warning("NeMo Gym supervisor did not exit in time; killing it")
                proc.kill()
                proc.wait()
            if proc.stdin is not None:
                proc.stdin.close()
        survivors = await self._sweep()
        await self.containers.stop()
        if self.relay is not None:
            await self.relay.stop()
        self.warm_start.release()
        if self._workdir_lock is not None:
            self._workdir_lock.close()  # a failed start's kept workdir may be pruned one day
            self._workdir_lock = None
        if self._ray_tmpdir is not None:
            shutil.rmtree(self._ray_tmpdir, ignore_errors=True)
            self._ray_tmpdir = None
        if self._ray_tmpdir_lock is not None:
            self._ray_tmpdir_lock.close()
            self._ray_tmpdir_lock = None
        if self._own_workdir and self.workdir is not None and not self._keeps_log():
            shutil.rmtree(self.workdir, ignore_errors=True)
        self._started = False
        if survivors:
            raise StackError(
                f"NeMo Gym processes survived SIGKILL: {survivors} (marker {self.marker})"
            )

    def _keeps_log(self) -> bool:
        """A failed start keeps its workdir for ng_run's log, if ng_run got to write one (a
        start that failed before, such as a bad config or a missing image, has none)."""
        try:
            return self._failed and self.log_path.stat().st_size > 0
        except OSError:
            return False

    def discard_workdir(self) -> None:
        """Remove the workdir a failed start kept for its log, if this stack created it (a
        given workdir is the caller's); nothing else of the stack is left after its stop."""
        if self._own_workdir and self._failed and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    async def _sweep(self) -> list[int]:
        """Kill whatever still carries our marker (normally nothing: the supervisor did it)."""
        entry = f"{MARKER_ENV_VAR}={self.marker}"

        def gone() -> bool:
            if alive := processes_with_env(entry):
                signal_with_env(alive, entry, signal.SIGKILL)  # by pidfd: never a reused PID
            return not alive

        await poll_until(gone, time.monotonic() + 5, 0.2)
        return processes_with_env(entry)
