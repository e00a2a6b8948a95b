"""What merged NeMo Gym configs (0.7+) ask of sandboxes, and the config a stack adds for them.

A container server names a sandbox provider (`sandbox_provider: sandbox`, a reference to a
top-level block a provider config defines, or an inline `{<provider>: {...}}`). `sandbox_plan`
reads what they ask, `row_image` the image a row runs in, and `stack_config` is what a stack adds
after the user's configs so containers are labelled, isolated and routed (docs/containers.md).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.nemo.catalog import (
    AGENTS,
    ENVIRONMENT_SERVERS,
    MODELS,
    PLACEHOLDER_IMPL,
    RESOURCES_SERVERS,
    server_blocks,
)
from verifiers_nemogym.nemo.harnesses import merge_configs, rollout_correlation

PROVIDER_REF = "sandbox_provider"
_RESERVED = frozenset({"default_metadata"})
CONTAINER_POLICY_INSTANCE = "vf_container_policy_model"
"""The model server instance the stack gives agents that call the model from a container: the
door's address, on the stack's container network (`stack_config`)."""
STACK_LABEL = "vf-nemogym.stack"
"""Docker label (`<STACK_LABEL>=<stack marker>`) on every container and network of a stack."""
PROVIDER_CONFIG = "nemo_gym/sandbox/providers/{name}/configs/{name}.yaml"
"""Where NeMo Gym 0.7 ships each provider's config (relative to its install)."""

PROVIDER_COMMANDS: dict[str, str] = {
    "docker": "docker",
    "apptainer": "apptainer",
    "enroot": "enroot",
}
"""Provider -> the command it runs on the machine (NeMo Gym 0.7.0's providers)."""
PROVIDER_PACKAGES = frozenset({"opensandbox", "daytona", "e2b", "ecs_fargate"})
"""Providers whose client is a Python package of NeMo Gym's `sandbox` extra. A server's
requirements ask for it (`-e nemo-gym[dev,sandbox] @ ../..`), but NeMo Gym drops that line when
installed from a wheel, so the stack adds `nemo-gym[sandbox]` to those servers' requirements
(`shadow_servers`)."""


def _swebench_pro_image(row: dict[str, Any], server: dict[str, Any]) -> str | None:
    if server.get("image_template"):
        return None  # a .sif path template: not a docker image
    repository = server.get("image_repository")
    if row.get("image_digest"):
        return f"{repository}@{row['image_digest']}"
    tag = row.get("dockerhub_tag")
    return f"{repository}:{tag}" if repository and tag else None


def _field(name: str) -> Callable[[dict[str, Any], dict[str, Any]], str | None]:
    def image(row: dict[str, Any], _server: dict[str, Any]) -> str | None:
        value = row.get(name)
        return value if isinstance(value, str) and value else None

    return image


ROW_IMAGES: dict[str, Callable[[dict[str, Any], dict[str, Any]], str | None]] = {
    "swebench_pro": _swebench_pro_image,
    "terminal_bench_2_1": _field("docker_image"),
    "swe_rebench": _field("image_name"),
    "swemer_v1": _field("image_ref"),
    "swemer_v2": _field("image_ref"),
    "swemer_oml": _field("image_ref"),
    "denovo_swe": _field("image_ref"),
    "swe_next": _field("image_ref"),
    "scale_swe": _field("image_url"),
}
"""Resources server type -> the image a row runs in (from the row, and for swebench_pro the
server's `image_repository`), as NeMo Gym 0.7.0's servers compute it."""


WRITES_IN_ITS_FOLDER: dict[str, tuple[str, ...]] = {
    impl: ("logs",)
    for impl in ("swebench_pro", "swe_rebench", "swemer_v1", "swemer_v2", "swemer_oml",
                 "denovo_swe", "swe_next", "scale_swe")
}  # fmt: skip
"""Resources server type -> the folders it writes inside its own folder (NeMo Gym 0.7.0:
`Path(__file__).parent / "logs"`, its verifier logs), which `shadow_servers` moves into the
stack's folder."""
READS_BESIDE: dict[str, tuple[str, ...]] = {"swebench_pro": ("swebench",)}
"""Resources server type -> the sibling server folders it reads files of (swebench_pro runs
`../swebench/anti_cheat_setup.sh`)."""


@dataclass(frozen=True)
class SandboxedServer:
    """A server instance of the configs that starts sandboxes."""

    instance: str
    server_type: str
    impl: str
    provider: str
    settings: dict[str, Any] = field(repr=False)

    def request(self, key: str) -> float | None:
        """Its `sandbox_config.resources.<key>` (e.g. `cpu`, `memory_mib`), if set."""
        resources = (self.settings.get("sandbox_config") or {}).get("resources") or {}
        value = resources.get(key)
        return float(value) if isinstance(value, int | float) else None

    @property
    def calls_model(self) -> bool:
        """An agent whose CLI calls the model from inside its container."""
        return self.server_type == AGENTS and isinstance(self.settings.get("model_server"), dict)


@dataclass(frozen=True)
class SandboxPlan:
    """What the configs ask of sandboxes: the servers that use one, the provider each resolves
    to, their resource requests, and the agents that call the model from inside a container."""

    servers: list[SandboxedServer]
    providers: dict[str, dict[str, Any]]
    """Provider name -> its settings, for every provider a server resolves to."""
    blocks: dict[str, str]
    """Top-level provider block name a server references -> the provider it defines."""
    merged: dict[str, Any] = field(repr=False)

    @property
    def docker(self) -> dict[str, Any] | None:
        """The docker provider's settings, when a server uses it."""
        return self.providers.get("docker")

    @property
    def model_agents(self) -> list[SandboxedServer]:
        return [s for s in self.servers if s.calls_model]

    def describe(self) -> str:
        return ", ".join(f"{s.instance} ({s.provider})" for s in self.servers)


def sandbox_plan(configs: Iterable[dict[str, Any]]) -> SandboxPlan | None:
    """The plan of merged `configs` (later ones win), None when no server uses a sandbox; a
    reference no config defines is a ConfigError naming the server and the provider configs."""
    merged = merge_configs(configs)
    servers: list[SandboxedServer] = []
    providers: dict[str, dict[str, Any]] = {}
    blocks: dict[str, str] = {}
    for server_type in (AGENTS, RESOURCES_SERVERS, ENVIRONMENT_SERVERS):
        for instance, (impl, settings) in server_blocks(merged, server_type).items():
            ref = settings.get(PROVIDER_REF)
            if ref is None:
                continue
            name, provider_settings = _resolve(instance, ref, merged)
            providers[name] = provider_settings
            if isinstance(ref, str):
                blocks[ref] = name
            servers.append(SandboxedServer(instance, server_type, impl, name, settings))
    return SandboxPlan(servers, providers, blocks, merged) if servers else None


def _resolve(instance: str, ref: Any, merged: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    block = merged.get(ref) if isinstance(ref, str) else ref
    if not isinstance(block, dict):
        shipped = ", ".join(PROVIDER_CONFIG.format(name=n) for n in ("docker", "apptainer"))
        raise ConfigError(
            f"{instance}: sandbox_provider {ref!r} is defined by no config; add a provider "
            f"config to --env.taskset.config-paths (e.g. {shipped})"
        )
    names = [key for key in block if key not in _RESERVED]
    if len(names) != 1 or not isinstance(block[names[0]], dict | None):
        raise ConfigError(
            f"{instance}: sandbox provider block {ref!r} must name exactly one provider "
            f"(it has {', '.join(map(str, names)) or 'none'})"
        )
    return str(names[0]), dict(block[names[0]] or {})


def row_image(row: dict[str, Any], agent: str, merged: dict[str, Any]) -> str | None:
    """The image `row` (run by agent instance `agent`) runs in, or None if its resources server
    takes no image from the row (`ROW_IMAGES`)."""
    agents = server_blocks(merged, AGENTS)
    if agent not in agents:
        return None
    ref = agents[agent][1].get("resources_server")
    name = ref.get("name") if isinstance(ref, dict) else None
    resources = server_blocks(merged, RESOURCES_SERVERS)
    if name not in resources:
        return None
    impl, settings = resources[name]
    image = ROW_IMAGES.get(impl)
    return image(row, settings) if image is not None else None


def stack_config(
    plan: SandboxPlan,
    *,
    label: str | None,
    network: str | None,
    door: tuple[str, int] | None,
    workdir: Path,
    dns: str | None = None,
) -> dict[str, Any]:
    """The config entries a stack adds for `plan`: for the docker provider the stack's network and
    label on every container; for every agent calling the model from a container a
    `model_server` at the door and an `artifacts_dir` in `workdir`; rollout correlation on, so a
    container's URL is its rollout's (`/ng-rollout/<rollout id>/v1`). `label`: `key=value` for
    every docker container; `network`: the docker network they join (None: the provider's
    own setting stands); `door`: its host and port (None: agents keep their model server);
    `workdir`: the stack's folder; `dns`: the containers' upstream name server (docker's
    `--dns`, `containers.names`), None to leave docker's."""
    config: dict[str, Any] = rollout_correlation(workdir / "model-calls")
    if plan.docker is not None and label is not None:
        create = dict(plan.docker.get("create") or {})
        extra = [str(arg) for arg in create.get("extra_run_args") or []]
        create["extra_run_args"] = [*extra, "--label", label, *(["--dns", dns] if dns else [])]
        if network is not None:
            create["network"] = network
        for block, provider in plan.blocks.items():
            if provider == "docker":
                config[block] = {"docker": {"create": create}}
    for agent in plan.model_agents:
        settings: dict[str, Any] = {}
        if door is not None:
            settings["model_server"] = {"type": MODELS, "name": CONTAINER_POLICY_INSTANCE}
        if "artifacts_dir" in agent.settings:
            settings["artifacts_dir"] = str(workdir / "artifacts" / agent.instance)
        if settings:
            config[agent.instance] = {AGENTS: {agent.impl: settings}}
    if plan.model_agents and door is not None:
        host, port = door
        config[CONTAINER_POLICY_INSTANCE] = {
            MODELS: {PLACEHOLDER_IMPL: {"entrypoint": "app.py", "host": host, "port": port}}
        }
    return config


def shadow_servers(
    plan: SandboxPlan, installed: Path, workdir: Path, nemo_gym_version: str
) -> list[str]:
    """Run some servers of `plan` from a folder of the stack's own, `workdir/<type>/<name>/` (NeMo
    Gym looks for a server's folder in its cwd, the stack's folder, before its install,
    `installed`: the runtime's site-packages), whose entries link to the installed ones except:
    - what a resources server writes inside its folder (`WRITES_IN_ITS_FOLDER`): real folders,
      removed with the stack's (NeMo Gym runs a single-process server as `python app.py` from
      its folder, so its `__file__` is the link's path); the sibling folders it reads
      (`READS_BESIDE`) are linked beside it;
    - for a server whose provider is a Python package (`PROVIDER_PACKAGES`), `requirements.txt`:
      the installed one plus `nemo-gym[sandbox]==<nemo_gym_version>`, so its venv has the client.
    Returns `<type>/<name>` of each server so run."""
    shadowed = []
    for server_type, impl in sorted({(s.server_type, s.impl) for s in plan.servers}):
        providers = {
            s.provider for s in plan.servers if (s.server_type, s.impl) == (server_type, impl)
        }
        writes = WRITES_IN_ITS_FOLDER.get(impl, ()) if server_type == RESOURCES_SERVERS else ()
        client = bool(providers & PROVIDER_PACKAGES)
        source = installed / server_type / impl
        if not (writes or client) or not source.is_dir():
            continue
        target = workdir / server_type / impl
        target.mkdir(parents=True, exist_ok=True)
        own = {*writes, "requirements.txt"} if client else set(writes)
        for entry in source.iterdir():
            if entry.name not in own and not entry.name.startswith("."):
                (target / entry.name).symlink_to(entry)
        for folder in writes:
            (target / folder).mkdir(exist_ok=True)
        if client:
            requirements = source / "requirements.txt"
            text = requirements.read_text() if requirements.is_file() else ""
            (target / "requirements.txt").write_text(
                f"{text.rstrip()}\nnemo-gym[sandbox]=={nemo_gym_version}\n".lstrip()
            )
        for sibling in READS_BESIDE.get(impl, ()):
            if not (workdir / server_type / sibling).exists():
                (workdir / server_type / sibling).symlink_to(installed / server_type / sibling)
        shadowed.append(f"{server_type}/{impl}")
    return shadowed


def check_providers(plan: SandboxPlan) -> None:
    """ConfigError (one line) if a provider of `plan` runs a command (`PROVIDER_COMMANDS`) that is
    not on PATH."""
    for provider in sorted(plan.providers):
        command = PROVIDER_COMMANDS.get(provider)
        if command is not None and shutil.which(command) is None:
            users = ", ".join(s.instance for s in plan.servers if s.provider == provider)
            raise ConfigError(
                f"{users}: NeMo Gym's {provider!r} sandbox provider needs the `{command}` command "
                "on PATH, which is not there"
            )
