"""NeMoGymTaskset: NeMo Gym JSONL rows as verifiers tasks.

Rows come from an environment's packaged data (`nemo_env`) or any JSONL file (`jsonl_path`).
Several environments' rows load in turn (`in_turn`: the first row of each environment, then the
second...), so verifiers' `-n N` (the first N tasks) takes rows from every environment.
Each task keeps its row untouched (`data.row`) plus the agent that runs it (`data.agent`) and a
prompt for display. Bad input raises `ConfigError` naming the file and line.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self, TypeVar, cast

import verifiers.v1 as vf
from pydantic import ConfigDict, Field, PrivateAttr, field_validator, model_validator
from verifiers.v1.dialects.responses import ResponsesDialect
from verifiers.v1.runtimes import Runtime

from verifiers_nemogym.containers.docker import check_isolation, daemon, missing_images
from verifiers_nemogym.containers.sandbox import (
    SANDBOX_PACKAGES_OPTION,
    SandboxPlan,
    check_sandbox_packages,
    row_image,
    sandbox_plan,
)
from verifiers_nemogym.context import RolloutContext
from verifiers_nemogym.errors import ConfigError, VenvSetupError
from verifiers_nemogym.judge.config import NeMoGymJudgeConfig
from verifiers_nemogym.nemo.catalog import AGENTS, Catalog, load_config, server_blocks
from verifiers_nemogym.nemo.judges import JudgeRef, active, judge_refs
from verifiers_nemogym.nemo.ray_cluster import parse_ray_address
from verifiers_nemogym.nemo.release import ReleaseFiles, check_release, release_files
from verifiers_nemogym.nemo.rewards import OPTION as REWARD_RANGE_OPTION
from verifiers_nemogym.nemo.rewards import RewardRange, check_range, declared_ranges
from verifiers_nemogym.nemo.venv import NeMoGymVenv, check_interpreter, default_version, ensure_venv
from verifiers_nemogym.shared.tls import parse_pin

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


class NeMoGymTaskConfig(vf.TaskConfig):
    """Per-rollout knobs, under `--env.taskset.task.*`."""

    run_timeout: float = Field(1800.0, gt=0)
    """Seconds one rollout's `POST /run` may take; on expiry the request is cancelled and the
    rollout fails with an error (verifiers' `--env.agent.timeout.rollout` also applies)."""

    _live: RolloutContext | None = PrivateAttr(default=None)
    """The running stack, set by `NeMoGymEnv.start()` and read by every task (shared object)."""
    _start_error: str | None = PrivateAttr(default=None)
    """Why `NeMoGymEnv.start()` could not bring the stack up; every rollout fails with it."""


class NeMoGymTasksetConfig(vf.TasksetConfig):
    """Which rows load and which NeMo Gym runs them, under `--env.taskset.*`."""

    nemo_env: list[str] = Field(default_factory=list)
    """NeMo Gym environment name(s) (resources server folders, e.g. `example_single_tool_call`).
    Their configs are started on one stack; without `jsonl_path` their `dataset` rows load.
    Several on the command line: `a,b` or `a b` (a repeated flag keeps only its last value).
    Several environments' rows load in turn (first row of each, then second...): `-n N` takes
    rows of every environment."""
    jsonl_path: Path | None = None
    """A JSONL file of NeMo Gym rows to load instead of the environments' packaged data. Rows
    name their agent with `agent_ref`; rows without one go to the single agent of `nemo_env`."""
    dataset: str = "example"
    """Which declared dataset of each environment loads: `example` (shipped with NeMo Gym),
    `train` or `validation` (downloaded separately; a clear error says how)."""
    agent: str | None = None
    """Agent instance for rows without `agent_ref` (needed only if the stack has several)."""
    config_paths: list[str] = Field(default_factory=list)
    """Extra NeMo Gym config YAMLs (paths, or relative to the NeMo Gym install) to start."""
    nemo_gym_version: str | None = None
    """nemo-gym release installed in the runtime venv. Default: the newest known release
    whose declared Python floor an interpreter here meets (0.4.0: >= 3.12; 0.5.0-0.7.0:
    >= 3.13.14)."""
    python: str | None = None
    """Python for the NeMo Gym runtime: a path or a version such as `3.12`.
    Default: `$VF_NEMOGYM_PYTHON`, else the first suitable interpreter found."""
    allow_python_below_floor: bool = False
    """Explicit opt-in to a Python below the release's declared floor (0.5-0.7 declare
    >= 3.13.14, a CPython security-fix floor): uv then installs as for the floor version.
    `$VF_NEMOGYM_ALLOW_PYTHON_BELOW_FLOOR=1` opts in too. Recorded in every trace."""
    proxy_port: int = Field(0, ge=0, le=65535)
    """Port of the model proxy that NeMo Gym's agents call (0 picks a free one; with
    `stack_url`, 0 takes the port the stack's `policy_model` names)."""
    proxy_host: str = "127.0.0.1"
    """Address the model proxy binds. Loopback unless NeMo Gym runs on another machine
    (`stack_url`); the proxy's secret is required on every call whatever the address."""
    stack_url: str | None = None
    """Head server URL of a NeMo Gym stack started elsewhere (e.g. `http://gpu-node:11000`):
    attach to it instead of starting one. Its `policy_model` must be this env's proxy address
    (`proxy_host`:`proxy_port`); its agents come from its running config."""
    stack_pin: str | None = None
    """With `stack_url` `https://HOST:PORT`: the SHA-256 pin (`sha256:<hex>`) of the
    certificate of a shared stack host started with `nemo-gym-env stack up --listen` (it prints
    both). The connection is TLS pinned to that certificate, model calls ride back on it (the
    proxy stays on loopback), and the stack host's access token comes from `stack_token_file`
    or `$VF_NEMOGYM_STACK_TOKEN`."""
    stack_token_file: Path | None = None
    """File holding the access token of the stack host named by `stack_url` and `stack_pin`
    (default: the token in `$VF_NEMOGYM_STACK_TOKEN`). Never pass the token itself as an
    option: command lines are visible to every user of a machine."""
    ray_address: str | None = None
    """`host:port` of a running Ray cluster's head (its GCS port) for the NeMo Gym stack
    started here to join instead of a private, token-protected Ray of its own; this machine
    must be a node of the cluster. A token-protected cluster's token comes from
    `RAY_AUTH_TOKEN_PATH` (a file), `RAY_AUTH_TOKEN` or `~/.ray/auth_token`, as Ray reads them,
    and reaches no command line, log or NeMo Gym config. Part of a shared stack's identity
    (docs/runtime.md, "Using your Ray cluster")."""
    start_timeout: float = Field(900.0, gt=0)
    """Seconds the NeMo Gym stack may take to start before it is stopped and an error raised
    (starts tried again after Ray's node timed out or the head port was taken included)."""
    keep_ng_trajectory: bool = False
    """Keep NeMo Gym's own trajectory records in `trace.info["nemo_gym"]` when a `/run` result
    carries them (`ng_trajectory`, `ng_agent_observations`, `ng_model_call_capture`: NeMo Gym
    >= 0.7 with observability or token capture on); they repeat what verifiers records."""
    reward_range: tuple[float, float] | None = None
    """Inclusive `[low, high]` every NeMo Gym reward of the run must fall in (e.g. `[0, 1]`); a
    reward outside it is no measurement, and its rollout an error naming the reward and the
    range, never that reward. Default: per agent, the range NeMo Gym's own manifests declare for
    its resources server (`reward.range` of its benchmarks' `manifest.yaml`, NeMo Gym 0.7+), else
    the range of a pass/fail grader read from NeMo Gym's code (swe_next: 0 or 1), else no bound
    (any finite number). Recorded in every trace."""
    shared_stack: bool = True
    """Share one NeMo Gym stack with every env process on this machine that asks for the same
    one (same nemo-gym version, Python and configs): attach to it, or start it for all. False
    starts a private stack owned by this process (the behaviour before shared stacks)."""
    stack_idle_grace: float = Field(5.0, ge=0)
    """Seconds a shared stack this process starts stays up after its last user left (a stack
    started with `nemo-gym-env stack up` keeps its own idle timeout)."""
    allow_unisolated_containers: bool = False
    """Explicit opt-in to sandbox containers nemo-gym-env cannot isolate (not root, no
    iptables, a rootless or remote docker daemon, a provider other than docker): without it
    such a stack is refused in one line naming what is missing; with it the containers reach
    every service this host serves them and one warning says so. Part of a shared stack's
    identity (docs/containers.md, "Isolation")."""
    sandbox_packages: list[str] = Field(default_factory=list)
    """Requirement lines added to the venvs of the NeMo Gym servers that start sandboxes, e.g.
    the package of a NeMo Gym plug-in's sandbox provider (one its `nemo_gym.sandbox_providers`
    entry point registers): a requirement (`my-provider==1.2`) or a local wheel, sdist or
    package folder (made absolute). Those servers' venvs are then a set of their own, named by
    the lines and the local packages' contents. A pip option, a URL with credentials or a
    missing path is refused in one line. Part of a shared stack's identity
    (docs/containers.md, "Sandbox providers")."""
    judge: NeMoGymJudgeConfig | None = None
    """The judge for NeMo Gym's LLM-judge environments (`--env.taskset.judge.base-url URL
    --env.taskset.judge.model NAME --env.taskset.judge.api-key-var VAR`). Without one, an
    environment that needs a judge is refused before anything starts."""
    task: NeMoGymTaskConfig = NeMoGymTaskConfig()

    @field_validator("nemo_env", mode="before")
    @classmethod
    def _split_names(cls, value: Any) -> Any:
        # `--env.taskset.nemo-env a,b` or `a b`, and a TOML string or list, all mean a list of
        # names (the CLI hands the comma form over as one list item; of a repeated flag it
        # keeps the last value before any validator runs).
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            return value
        return [n.strip() for item in items for n in str(item).split(",") if n.strip()]

    @field_validator("reward_range", mode="before")
    @classmethod
    def _reward_range(cls, value: Any) -> Any:
        if isinstance(value, str):  # a flag's text, `[0, 1]`
            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError(
                    f"{REWARD_RANGE_OPTION} takes [low, high], got {value!r}"
                ) from None
        if value is None:
            return None
        if not isinstance(value, list | tuple):
            raise ValueError(f"{REWARD_RANGE_OPTION} takes [low, high], got {value!r}")
        return check_range(value)

    @field_validator("sandbox_packages", mode="before")
    @classmethod
    def _sandbox_packages(cls, value: Any) -> Any:
        # A flag's text: one line, or a JSON list of them.
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.lstrip().startswith("[") else [value]
            except ValueError:
                raise ValueError(f"{SANDBOX_PACKAGES_OPTION}: not a JSON list: {value}") from None
        if not isinstance(value, list):
            raise ValueError(f"{SANDBOX_PACKAGES_OPTION} takes a list of requirement lines")
        try:
            return check_sandbox_packages(value)
        except ConfigError as e:
            raise ValueError(str(e)) from None

    @field_validator("ray_address")
    @classmethod
    def _ray_address(cls, value: str | None) -> str | None:
        return None if value is None else parse_ray_address(value)

    @field_validator("nemo_gym_version")
    @classmethod
    def _release_number(cls, value: str | None) -> str | None:
        return None if value is None else check_release(value)

    _release_version: str | None = PrivateAttr(default=None)

    def release_version(self) -> str:
        """The nemo-gym release: `nemo_gym_version`, else the newest one an interpreter here
        meets (`venv.default_version`, which runs each interpreter once to read its version),
        chosen once per config."""
        if self._release_version is None:
            self._release_version = self.nemo_gym_version or default_version(self.python)
        return self._release_version

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Self:
        # Raised here, the CLI's config parse reports them as one line naming the field. (Not
        # "rows are required": verifiers' CLI builds a default config before parsing flags.)
        if self.jsonl_path is not None and not self.jsonl_path.expanduser().is_file():
            raise ValueError(f"env.taskset.jsonl_path: no such file: {self.jsonl_path}")
        if self.python is not None:
            try:
                check_interpreter(self.python)
            except VenvSetupError as e:
                raise ValueError(f"env.taskset.python: {e}") from None
        if self.nemo_env:
            # The release's files (fetched once, no runtime) say which names exist.
            catalog = Catalog(release_files(self.release_version()))
            for name in self.nemo_env:
                try:
                    catalog.check(name)
                except ConfigError as e:
                    raise ValueError(f"env.taskset.nemo_env: {e}") from None
        if self.judge is not None and self.stack_url is not None:
            raise ValueError(
                "--env.taskset.judge is for stacks this machine starts; a stack named by "
                "--env.taskset.stack-url grades with the judge its own config names"
            )
        if self.ray_address is not None and self.stack_url is not None:
            raise ValueError(
                "--env.taskset.ray-address is for stacks this machine starts; a stack named by "
                "--env.taskset.stack-url runs on the Ray its starter gave it"
            )
        if self.sandbox_packages and self.stack_url is not None:
            raise ValueError(
                "--env.taskset.sandbox-packages is for stacks this machine starts; a stack named "
                "by --env.taskset.stack-url has the venvs its starter gave it"
            )
        if self.stack_pin is not None:
            try:
                parse_pin(self.stack_pin)
            except ConfigError as e:
                raise ValueError(f"env.taskset.stack_pin: {e}") from None
            if self.stack_url is None or not self.stack_url.startswith("https://"):
                raise ValueError(
                    "--env.taskset.stack-pin pins the certificate of an https:// "
                    "--env.taskset.stack-url (a stack host started with `stack up --listen`)"
                )
            if self.proxy_host != "127.0.0.1":
                raise ValueError(
                    "--env.taskset.proxy-host is not used with --env.taskset.stack-pin: model "
                    "calls ride back on the TLS link, the proxy stays on 127.0.0.1"
                )
        if self.stack_token_file is not None and self.stack_pin is None:
            raise ValueError(
                "--env.taskset.stack-token-file is for a stack host named by "
                "--env.taskset.stack-url and --env.taskset.stack-pin"
            )
        if self.proxy_host != "127.0.0.1" and self.stack_url is None:
            raise ValueError(
                "--env.taskset.proxy-host is for --env.taskset.stack-url; a stack this "
                "machine starts reaches the proxy on 127.0.0.1"
            )
        return self


class NeMoGymData(vf.TaskData):
    """A task: one NeMo Gym row, untouched, and the agent instance that runs it."""

    model_config = ConfigDict(frozen=True)

    row: dict[str, Any]
    """The JSONL row as read; posted to the agent's `/run` (plus a routing tag)."""
    agent: str | None = None
    """Agent instance name (the row's `agent_ref.name`, else the taskset's only agent)."""
    source: str = ""
    """Where the row came from, as `file:line`."""


class NeMoGymState(vf.State):
    """Per-rollout state: the live stack handle, copied from the task config in `setup`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    live: RolloutContext | None = None
    start_error: str | None = None


class NeMoGymTask(vf.Task[NeMoGymData, NeMoGymState, NeMoGymTaskConfig]):
    """A NeMo Gym row; scoring happens inside NeMo Gym (`/run` verifies), see the harness."""

    async def setup(self, trace: vf.Trace, runtime: Runtime) -> None:
        # verifiers builds the state from this task's StateT but types it as its base State.
        state = cast(NeMoGymState, trace.state)
        state.live, state.start_error = self.config._live, self.config._start_error


# type-var: verifiers bounds Taskset's task type by Task[Any, State, TaskConfig] with invariant
# parameters, so no task with its own State or TaskConfig subclass satisfies it statically.
class NeMoGymTaskset(vf.Taskset[NeMoGymTask, NeMoGymTasksetConfig]):  # type: ignore[type-var]
    """NeMo Gym rows by environment name or JSONL path (see `NeMoGymTasksetConfig`)."""

    def __init__(self, config: NeMoGymTasksetConfig) -> None:
        super().__init__(config)
        if not config.nemo_env and config.jsonl_path is None:
            raise ConfigError(
                "nemo-gym-env needs rows: set --env.taskset.nemo-env NAME (a NeMo Gym "
                "environment, e.g. example_single_tool_call) or --env.taskset.jsonl-path FILE"
            )
        self._release: ReleaseFiles | None = None
        self._nemo_venv: NeMoGymVenv | None = None
        self._catalog: Catalog | None = None

    @property
    def nemo_gym_version(self) -> str:
        """The nemo-gym release (`NeMoGymTasksetConfig.release_version`)."""
        return self.config.release_version()

    @property
    def release(self) -> ReleaseFiles:
        """The release's files (fetched once; no runtime): what `load()` reads."""
        if self._release is None:
            self._release = release_files(self.nemo_gym_version)
        return self._release

    @property
    def nemo_venv(self) -> NeMoGymVenv:
        """The NeMo Gym runtime venv (created on first use, then cached on disk). Only what
        runs rollouts needs it (`NeMoGymEnv.start`); `load()` does not."""
        if self._nemo_venv is None:
            self._nemo_venv = ensure_venv(
                self.nemo_gym_version,
                self.config.python,
                # False here defers to $VF_NEMOGYM_ALLOW_PYTHON_BELOW_FLOOR.
                allow_below_floor=True if self.config.allow_python_below_floor else None,
            )
        return self._nemo_venv

    @property
    def catalog(self) -> Catalog:
        """The release's environments, read from its files; a config NeMo Gym must merge
        (includes, inheritance) builds the runtime to merge it, once per file and release."""
        if self._catalog is None:
            self._catalog = Catalog(self.release, runtime=lambda: self.nemo_venv)
            for name in self.config.nemo_env:
                self._catalog.env(name)  # unknown names fail here, before anything starts
        return self._catalog

    def config_paths(self) -> list[Path]:
        """NeMo Gym config YAMLs the stack needs: those of `nemo_env`, of every agent the rows
        name, and `config_paths`."""
        # The runtime's copies: the stack runs them (the release's files are the same bytes).
        catalog = Catalog(self.nemo_venv)
        paths: list[Path] = []
        for name in self.config.nemo_env:
            paths.extend(catalog.env(name).config_paths)
        if self.config.jsonl_path is not None:
            known = self._known_agents(catalog)
            wanted = {t.data.agent for t in self.load() if t.data.agent is not None}
            for agent in wanted - known:
                paths.extend(catalog.agent_env(agent).config_paths)
        paths.extend(catalog.config_path(extra) for extra in self.config.config_paths)
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise ConfigError(f"NeMo Gym config file(s) not found: {', '.join(missing)}")
        for path in paths:
            load_config(path)  # a YAML error names file:line:col before anything starts
        return list(dict.fromkeys(paths))

    def load(self) -> Iterator[NeMoGymTask]:
        """The rows as tasks, read from the release's files or `jsonl_path`: no runtime is
        built and no process started (unless a config must be merged by NeMo Gym). Everything
        a stack would refuse later (agents, extra configs) is checked first, so bad input fails
        here, in the process that loads the taskset, before any env server starts."""
        tasks = list(self._rows())
        self._check(tasks)
        yield from tasks

    def _check(self, tasks: list[NeMoGymTask]) -> None:
        catalog = self.catalog
        for extra in self.config.config_paths:
            path = catalog.config_path(extra)
            if not path.is_file():
                raise ConfigError(f"NeMo Gym config file not found: {path}")
            load_config(path)  # a YAML error names file:line:col
        if any(t.data.agent is None for t in tasks):
            raise ConfigError(
                "some rows have no agent_ref and the environments define several agents; "
                "set agent_ref in the rows or --env.taskset.agent"
            )
        if self.config.jsonl_path is not None:
            known = self._known_agents(catalog)
            for agent in sorted({str(t.data.agent) for t in tasks} - known):
                catalog.agent_env(agent)  # an agent no environment or config defines fails here
        if self.config.stack_url is None:
            self._check_judge()

    def _known_agents(self, catalog: Catalog) -> set[str]:
        """Agent instances `nemo_env`'s environments and the extra `config_paths` define (a
        benchmark pairing such as `benchmarks/swebench/pro/opencode.yaml` as NeMo Gym merges
        it)."""
        known = {a.name for n in self.config.nemo_env for a in catalog.env(n).agents}
        for extra in self.config.config_paths:
            known.update(server_blocks(catalog.merged_config(catalog.config_path(extra)), AGENTS))
        return known

    def sandbox_plan(self, config_paths: list[Path]) -> SandboxPlan | None:
        """What `config_paths` (what `config_paths()` returned) ask of sandbox providers
        (`containers.sandbox.sandbox_plan`); None when no server starts a sandbox."""
        catalog = Catalog(self.nemo_venv)
        return sandbox_plan(catalog.merged_config(path) for path in config_paths)

    def check_container_images(self, plan: SandboxPlan | None) -> None:
        """For `plan` (what `sandbox_plan()` returned; None: no server starts a sandbox), before
        any rollout starts: a one-line error if its sandboxes cannot be isolated and
        `allow_unisolated_containers` is off (`check_isolation`), or naming the first row whose
        docker image the daemon does not have (and how many are missing), or no daemon. Reads
        no image of a provider other than docker."""
        if plan is None:
            return
        host = daemon() if plan.docker is not None else None
        check_isolation(plan, host, self.config.allow_unisolated_containers, log=None)
        if host is None:
            return
        wanted: dict[str, str] = {}
        for task in self.load():
            if task.data.agent is not None:
                image = row_image(task.data.row, task.data.agent, plan.merged)
                if image is not None:
                    wanted.setdefault(image, task.data.source)
        if missing := missing_images(wanted):
            more = f" ({len(missing)} images missing)" if len(missing) > 1 else ""
            raise ConfigError(
                f"{wanted[missing[0]]}: the row runs in image {missing[0]!r}, which the docker "
                f"daemon does not have; build or load it first{more}"
            )

    def reward_ranges(self, config_paths: list[Path]) -> dict[str, RewardRange]:
        """Agent instance of `config_paths` (what `config_paths()` returned) -> the reward
        range NeMo Gym's manifests declare for it (`nemo.rewards.declared_ranges`)."""
        catalog = Catalog(self.nemo_venv)
        merged = [catalog.merged_config(path) for path in config_paths]
        return declared_ranges(self.nemo_venv.site_packages, merged)

    def stated_range(self) -> RewardRange | None:
        """The user's `reward_range`, for every agent of the run."""
        if self.config.reward_range is None:
            return None
        return RewardRange(*self.config.reward_range, source=REWARD_RANGE_OPTION)

    def judge_refs(self) -> dict[str, list[JudgeRef]]:
        """Environment (or extra config) -> the judge references a judge must serve on this
        config (`nemo.judges`; optional ones only with the judge's `enable_optional`)."""
        catalog = self.catalog
        enable = self.config.judge is not None and self.config.judge.enable_optional
        found: dict[str, list[JudgeRef]] = {}
        sources = [(n, p) for n in self.config.nemo_env for p in catalog.env(n).config_paths]
        sources += [(extra, catalog.config_path(extra)) for extra in self.config.config_paths]
        for name, path in sources:
            if refs := active(judge_refs(catalog.merged_config(path)), enable):
                found.setdefault(name, []).extend(refs)
        return found

    def _check_judge(self) -> None:
        needs = self.judge_refs()
        if needs and self.config.judge is None:
            raise ConfigError(
                f"{', '.join(needs)} grade(s) with an LLM judge: name one with "
                "--env.taskset.judge.base-url URL --env.taskset.judge.model NAME "
                "--env.taskset.judge.api-key-var VAR"
            )
        if self.config.judge is not None:
            self.config.judge.key()  # an unset key variable fails here, not in every rollout

    def _rows(self) -> Iterator[NeMoGymTask]:
        if self.config.jsonl_path is not None:
            default_agent = self._default_agent()
            path = self.config.jsonl_path.expanduser().resolve()
            yield from self._read(path, path.name, default_agent)
            return
        per_env = []
        for name in self.config.nemo_env:
            env = self.catalog.env(name)
            default = self.config.agent or (env.agents[0].name if len(env.agents) == 1 else None)
            label = f"{name}/{self.config.dataset}"
            per_env.append(list(self._read(env.dataset(self.config.dataset), label, default)))
        # Environments in turn (the first row of each, then the second of each...), so that
        # `-n N` (verifiers takes the first N tasks) runs rows of every environment.
        yield from in_turn(per_env)

    def _default_agent(self) -> str | None:
        if self.config.agent is not None:
            return self.config.agent
        agents = [a.name for n in self.config.nemo_env for a in self.catalog.env(n).agents]
        return agents[0] if len(agents) == 1 else None

    def _read(self, path: Path, label: str, default_agent: str | None) -> Iterator[NeMoGymTask]:
        """Tasks from `path`, named `<label>:<line>`."""
        if not path.is_file():
            raise ConfigError(f"NeMo Gym rows file not found: {path}")
        found = False
        with path.open("rb") as lines:  # decoded per line: an error can name its line
            for number, raw in enumerate(lines, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ConfigError(
                        f"{path}:{number}: not UTF-8 (byte {e.start + 1} of the line)"
                    ) from None
                if not line.strip():
                    continue
                found = True
                data = parse_row(line, f"{path}:{number}", default_agent)
                data = data.model_copy(
                    update={"id": f"{label}:{number}", "name": f"{label}:{number}"}
                )
                yield NeMoGymTask(data, self.config.task)
        if not found:
            raise ConfigError(f"NeMo Gym rows file is empty: {path}")


def in_turn(groups: list[list[_T]]) -> Iterator[_T]:
    """The items of `groups` taken in turn: each group's first item, then each group's second,
    and so on; a group that runs out is skipped. Each group keeps its own order."""
    for depth in range(max((len(g) for g in groups), default=0)):
        yield from (group[depth] for group in groups if depth < len(group))


_DIALECT = ResponsesDialect()
_DROPPED_SAMPLING = ("temperature", "top_p", "max_output_tokens")


def parse_row(line: str, where: str, default_agent: str | None) -> NeMoGymData:
    """One JSONL line as task data; `where` (`file:line`) prefixes every error."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        raise ConfigError(f"{where}: row has no `responses_create_params` object")
    if not isinstance(params.get("input"), str | list):
        raise ConfigError(f"{where}: `responses_create_params.input` must be a string or list")
    metadata = params.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        # Routing rides in it on every model call; NeMo Gym's request model wants strings.
        raise ConfigError(
            f"{where}: `responses_create_params.metadata` must be an object of strings"
        )
    agent = default_agent
    ref = row.get("agent_ref")
    if ref is not None:
        if not isinstance(ref, dict) or not isinstance(ref.get("name"), str):
            raise ConfigError(f"{where}: `agent_ref` must be an object with a string `name`")
        agent = ref["name"]
    try:
        prompt = _DIALECT.parse_request(params).messages
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"{where}: cannot read `responses_create_params.input`: {e}") from None
    return NeMoGymData(prompt=prompt, row=row, agent=agent, source=where)


def row_sampling(row: dict[str, Any]) -> dict[str, Any]:
    """Sampling fields a row carries that verifiers' interception replaces with `--sampling.*`."""
    params = row["responses_create_params"]
    return {key: params[key] for key in _DROPPED_SAMPLING if key in params}
