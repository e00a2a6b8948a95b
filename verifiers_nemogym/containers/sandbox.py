"""What merged NeMo Gym configs (0.7+) ask of sandboxes, and the config a stack adds for them.

A container server names a sandbox provider (`sandbox_provider: sandbox`, a reference to a
top-level block a provider config defines, or an inline `{<provider>: {...}}`), or takes its
server's default (`nemo.sandboxes.DEFAULT_PROVIDERS`). `sandbox_plan` reads what they ask,
`row_image` the image a row runs in, and `stack_config` is what a stack adds after the user's
configs so containers are labelled, isolated, bounded and routed, whichever way they name their
provider (docs/containers.md).
"""

from __future__ import annotations

import csv
import io
import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.nemo.catalog import (
    AGENTS,
    MODELS,
    PLACEHOLDER_IMPL,
    RESOURCES_SERVERS,
    merge_configs,
    rollout_correlation,
    server_blocks,
)
from verifiers_nemogym.nemo.sandboxes import PROVIDER_REF, provider_refs

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
ISOLATED_PROVIDERS: set[str] = {"docker"}
"""Providers whose containers the package isolates (a module of its own per provider; docker:
`containers/providers/docker.py`). Any other provider's containers need the explicit opt-in
(`containers.docker.check_isolation`)."""
NG_KEEPALIVE = "while :; do sleep 2147483647; done"
"""NeMo Gym 0.7.0's docker keepalive (its default and its shipped docker.yaml): no end."""
DROPPED_CAPS = ("NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP", "SETPCAP", "SYS_CHROOT")
"""Capabilities of docker's default set no task needs (raw packets, device nodes, the audit
log, file capabilities, capability bounding, chroot); root in the container keeps the rest
(file ownership, setuid/setgid to drop to a user, kill)."""
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
GUARDED_VERIFY: dict[str, str] = {"terminal_bench_2_1": "verify_guard.py"}
"""Resources server type -> the file of this folder that `shadow_servers` runs as its `app.py`
when every instance of it uses the docker provider: NeMo Gym's server whose `/verify` first
ends the processes the agent's rollout left in the container it grades in (`verify_guard`)."""
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
    block: str | None = None
    """The top-level provider block it references; None: inline, or its agent's default."""
    provider_settings: dict[str, Any] = field(default_factory=dict, repr=False)
    """Its provider's settings (the block's, the inline ones, or the default's)."""

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
    for server_type, instance, impl, settings, ref in provider_refs(merged):
        name, provider_settings = _resolve(instance, ref, merged)
        providers[name] = provider_settings
        block = ref if isinstance(ref, str) else None
        if block is not None:
            blocks[block] = name
        servers.append(
            SandboxedServer(instance, server_type, impl, name, settings, block, provider_settings)
        )
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


DEFAULT_DISK = "20g"
"""The writable layer each container gets where the daemon can bound it (overlay2 on xfs with
project quotas); elsewhere there is no bound (the stack's log says so)."""


@dataclass(frozen=True)
class Bounds:
    """What every docker container of a stack is held to, unless its provider config's `create`
    sets the key itself (a user loosening a bound for a task: `pids_limit`, `cap_drop`,
    `security_opt` with a `no-new-privileges` entry, `keepalive_cmd`)."""

    pids_limit: int = 1024
    """Processes (and threads) at once in one container: a fork bomb stops there."""
    cap_drop: tuple[str, ...] = DROPPED_CAPS
    no_new_privileges: bool = True
    """setuid binaries and file capabilities give nothing (`--security-opt no-new-privileges`)."""
    lifetime_s: int = 3600
    """Seconds a container lives at most: its keepalive is `sleep <lifetime_s>` and it runs with
    `--rm`, so it ends and is removed by the daemon alone, its owners dead or not. A server's
    `sandbox_config.ttl_s` (NeMo Gym's own lifetime, which replaces the keepalive: its shipped
    configs say 14400-18000) is capped at it, unless the provider's `create` sets its own
    `keepalive_cmd` (the user took the lifetime in hand)."""
    disk: str | None = None
    """A container's writable layer at most (`--storage-opt size=<disk>`, e.g. `20g`): set by
    the stack where the daemon can bound it (`docker.DockerHost.disk_quota`); None: no bound."""


APT_NO_RETRIES = "/etc/apt/apt.conf.d/99vf-nemogym-no-retries"
"""Where a firewalled stack's containers find `APT_NO_RETRIES_TEXT` (bind-mounted, read-only)."""
APT_NO_RETRIES_TEXT = (
    "// verifiers-nemogym: this container reaches nothing off the machine (its stack's\n"
    "// firewall), so apt's retries of a download could only wait (1 + 2 + 4 s an update).\n"
    'Acquire::Retries "0";\n'
)


def bind_mount(source: Path, target: str) -> str:
    """Docker's `--mount` value binding host file `source` read-only at `target`: its fields
    are CSV, so a path holding a comma or a quote is quoted, not split."""
    line = io.StringIO()
    fields = ["type=bind", f"source={source}", f"target={target}", "readonly"]
    csv.writer(line, lineterminator="").writerow(fields)
    return line.getvalue()


def docker_create(
    settings: dict[str, Any],
    labels: list[str],
    network: str | None,
    bounds: Bounds,
    dns: str | None = None,
    apt_conf: Path | None = None,
) -> dict[str, Any]:
    """The docker provider's `create` settings for a provider whose settings are `settings`:
    its own, plus `labels` (`key=value`), `--dns dns` (when given), `apt_conf` (a host file,
    when given) mounted read-only at `APT_NO_RETRIES` and `--rm` after its `extra_run_args`,
    `network` (None: its own setting stands) and each bound of `bounds` it does not set
    itself."""
    create = dict(settings.get("create") or {})
    extra = [str(arg) for arg in create.get("extra_run_args") or []]
    create["extra_run_args"] = [*extra, *(a for label in labels for a in ("--label", label))]
    if dns is not None:
        create["extra_run_args"] += ["--dns", dns]
    if apt_conf is not None:
        create["extra_run_args"] += ["--mount", bind_mount(apt_conf, APT_NO_RETRIES)]
    if bounds.disk is not None and not any(a.startswith("--storage-opt") for a in extra):
        create["extra_run_args"] += ["--storage-opt", f"size={bounds.disk}"]
    create["extra_run_args"].append("--rm")  # a container whose keepalive ends is removed
    if network is not None:
        create["network"] = network
    if create.get("pids_limit") is None:
        create["pids_limit"] = bounds.pids_limit
    if "cap_drop" not in create:
        create["cap_drop"] = list(bounds.cap_drop)
    options = [str(o) for o in create.get("security_opt") or []]
    if bounds.no_new_privileges and not any(o.startswith("no-new-privileges") for o in options):
        create["security_opt"] = [*options, "no-new-privileges"]
    if create.get("keepalive_cmd") in (None, NG_KEEPALIVE):
        create["keepalive_cmd"] = f"sleep {bounds.lifetime_s}"
    return create


def stack_config(
    plan: SandboxPlan,
    *,
    label: str | None,
    network: str | None,
    door: tuple[str, int] | None,
    workdir: Path,
    labels: tuple[str, ...] = (),
    bounds: Bounds | None = None,
    dns: str | None = None,
    apt_conf: Path | None = None,
) -> dict[str, Any]:
    """The config entries a stack adds for `plan`: for every server using the docker provider,
    however it names it (a block reference: the block; inline or by its agent's default: the
    server's own `sandbox_provider`), the stack's network, labels and bounds
    (`docker_create`); for every agent calling the model from a container a `model_server` at
    the door and an `artifacts_dir` in `workdir`; rollout correlation on, so a container's URL
    is its rollout's (`/ng-rollout/<rollout id>/v1`). `label`: `key=value` for every docker
    container (None: docker containers get nothing); `labels`: more of them; `network`: the
    docker network they join (None: the provider's own setting stands); `door`: its host and
    port (None: agents keep their model server); `workdir`: the stack's folder; `bounds`:
    default `Bounds()`; `dns`: the containers' name server (docker's `--dns`,
    `containers.names`), None to leave docker's; `apt_conf`: a file holding
    `APT_NO_RETRIES_TEXT` for the containers' apt (None: apt keeps its own retries)."""
    config: dict[str, Any] = rollout_correlation(workdir / "model-calls")
    if label is not None:
        every = [label, *labels]
        held = bounds or Bounds()
        for block, name in plan.blocks.items():
            if name == "docker":
                create = docker_create(
                    plan.merged[block]["docker"] or {}, every, network, held, dns, apt_conf
                )
                config[block] = {"docker": {"create": create}}
        for server in plan.servers:
            if server.provider == "docker" and server.block is None:
                create = docker_create(
                    server.provider_settings, every, network, held, dns, apt_conf
                )
                inline = {"docker": {**server.provider_settings, "create": create}}
                _server_settings(config, server)[PROVIDER_REF] = inline
            if server.provider == "docker" and (ttl := _capped_ttl(server, held)) is not None:
                _server_settings(config, server)["sandbox_config"] = {"ttl_s": ttl}
    for agent in plan.model_agents:
        settings: dict[str, Any] = {}
        if door is not None:
            settings["model_server"] = {"type": MODELS, "name": CONTAINER_POLICY_INSTANCE}
        if "artifacts_dir" in agent.settings:
            settings["artifacts_dir"] = str(workdir / "artifacts" / agent.instance)
        if settings:
            _server_settings(config, agent).update(settings)
    if plan.model_agents and door is not None:
        host, port = door
        config[CONTAINER_POLICY_INSTANCE] = {
            MODELS: {PLACEHOLDER_IMPL: {"entrypoint": "app.py", "host": host, "port": port}}
        }
    return config


def _capped_ttl(server: SandboxedServer, bounds: Bounds) -> int | None:
    """`bounds.lifetime_s` where `server`'s `sandbox_config.ttl_s` exceeds it (NeMo Gym's docker
    provider then runs `sleep <ttl_s>` as the keepalive, not `keepalive_cmd`) and its provider's
    `create` leaves `keepalive_cmd` to the stack; else None (the ttl stands)."""
    own = (server.provider_settings.get("create") or {}).get("keepalive_cmd")
    ttl = (server.settings.get("sandbox_config") or {}).get("ttl_s")
    if own not in (None, NG_KEEPALIVE) or not isinstance(ttl, int | float):
        return None
    return bounds.lifetime_s if ttl > bounds.lifetime_s else None


def docker_creates(plan: SandboxPlan, config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Docker server instance -> the `create` settings its provider has once `config` (what
    `stack_config` returned) is merged after the user's configs: what its containers get."""
    merged = merge_configs([plan.merged, config])
    found = {}
    for server in plan.servers:
        if server.provider != "docker":
            continue
        if server.block is not None:
            block = merged.get(server.block) or {}
        else:
            block = _server_settings(merged, server).get(PROVIDER_REF) or {}
        found[server.instance] = dict((block.get("docker") or {}).get("create") or {})
    return found


def _server_settings(config: dict[str, Any], server: SandboxedServer) -> dict[str, Any]:
    """`server`'s settings dict in `config` (made if absent)."""
    by_type = config.setdefault(server.instance, {}).setdefault(server.server_type, {})
    settings: dict[str, Any] = by_type.setdefault(server.impl, {})
    return settings


SANDBOX_PACKAGES_OPTION = "sandbox_packages (--env.taskset.sandbox-packages)"
"""The option naming extra requirement lines for the servers that start sandboxes."""
_LOCAL_SUFFIXES = (".whl", ".tar.gz", ".zip")


def check_sandbox_packages(lines: Sequence[str], base: Path | None = None) -> list[str]:
    """`lines` as requirement lines for the venvs of the servers that start sandboxes: each a
    PEP 508 requirement (`my-provider==1.2`, `my-provider @ https://...`) or a local package
    (a wheel or sdist file, or a folder with `pyproject.toml` or `setup.py`), which is made
    absolute (against `base`, default the cwd: the servers run elsewhere). One-line ConfigError
    naming the option for an empty line, a line of several lines, a pip option (`-...`: an index
    or a constraint would change every package of the venv), a URL carrying credentials (they
    would land in the stack's files and uv's log: give them to uv, e.g. `UV_INDEX_*` or netrc),
    a local path that does not exist, and text that is neither."""
    found: list[str] = []
    for raw in lines:
        line = raw.strip() if isinstance(raw, str) else ""
        if not line or "\n" in line or "\r" in line:
            raise ConfigError(f"{SANDBOX_PACKAGES_OPTION}: {raw!r} is not one requirement line")
        if line.startswith("-"):
            raise ConfigError(
                f"{SANDBOX_PACKAGES_OPTION}: {line!r} is a pip option; name a package or a path"
            )
        if "://" in line and "@" in line.split("://", 1)[1].split("/", 1)[0]:
            raise ConfigError(
                f"{SANDBOX_PACKAGES_OPTION}: a URL with credentials; give them to uv (netrc, "
                "UV_INDEX_* variables), never in the requirement"
            )
        local = _local_package(line, base)
        if local is not None:
            found.append(str(local))
            continue
        # Imported here: its specifier regex compiles at import (0.15-0.25 s on 2 cores), which
        # every env process paid at start while only a sandbox_packages line needs it.
        from packaging.requirements import InvalidRequirement, Requirement

        try:
            Requirement(line)
        except InvalidRequirement:
            raise ConfigError(
                f"{SANDBOX_PACKAGES_OPTION}: {line!r} is neither a requirement (name, version, "
                "URL) nor an existing local package"
            ) from None
        found.append(line)
    return found


def _local_package(line: str, base: Path | None) -> Path | None:
    """The absolute path `line` names when it is written as a path (a separator, a leading
    `.` or `~`, or an archive suffix, and no URL); ConfigError if nothing usable is there;
    None for a line written as a requirement."""
    if "://" in line or "@" in line:
        return None  # a URL or a direct reference (`name @ url`): a requirement
    if not (os.sep in line or line.startswith(("~", ".")) or line.endswith(_LOCAL_SUFFIXES)):
        return None
    path = Path(line).expanduser()
    path = (base or Path.cwd()) / path if not path.is_absolute() else path
    if path.is_file() and path.name.endswith(_LOCAL_SUFFIXES):
        return path.resolve()
    if path.is_dir() and any((path / f).is_file() for f in ("pyproject.toml", "setup.py")):
        return path.resolve()
    raise ConfigError(
        f"{SANDBOX_PACKAGES_OPTION}: {line!r}: no wheel, sdist or package folder (pyproject.toml "
        "or setup.py) there"
    )


def shadow_servers(
    plan: SandboxPlan,
    installed: Path,
    workdir: Path,
    nemo_gym_version: str,
    packages: Sequence[str] = (),
) -> list[str]:
    """Run some servers of `plan` from a folder of the stack's own, `workdir/<type>/<name>/` (NeMo
    Gym looks for a server's folder in its cwd, the stack's folder, before its install,
    `installed`: the runtime's site-packages), whose entries link to the installed ones except:
    - what a resources server writes inside its folder (`WRITES_IN_ITS_FOLDER`): real folders,
      removed with the stack's (NeMo Gym runs a single-process server as `python app.py` from
      its folder, so its `__file__` is the link's path); the sibling folders it reads
      (`READS_BESIDE`) are linked beside it;
    - for a server whose provider is a Python package (`PROVIDER_PACKAGES`), `requirements.txt`:
      the installed one plus `nemo-gym[sandbox]==<nemo_gym_version>`, so its venv has the client;
      with `packages` (`check_sandbox_packages`'s lines: a plug-in provider's package), every
      server of `plan` gets them in its `requirements.txt` too;
    - for a resources server of `GUARDED_VERIFY` all of whose instances use docker, `app.py`:
      a copy of the guard (a copy, not a link: Python puts a script's real folder first on
      `sys.path`).
    Returns `<type>/<name>` of each server so run."""
    shadowed = []
    for server_type, impl in sorted({(s.server_type, s.impl) for s in plan.servers}):
        providers = {
            s.provider for s in plan.servers if (s.server_type, s.impl) == (server_type, impl)
        }
        writes = WRITES_IN_ITS_FOLDER.get(impl, ()) if server_type == RESOURCES_SERVERS else ()
        client = bool(providers & PROVIDER_PACKAGES)
        extra = [f"nemo-gym[sandbox]=={nemo_gym_version}"] if client else []
        extra += list(packages)
        docker_only = server_type == RESOURCES_SERVERS and providers == {"docker"}
        guard = GUARDED_VERIFY.get(impl) if docker_only else None
        source = installed / server_type / impl
        if not (writes or extra or guard) or not source.is_dir():
            continue
        target = workdir / server_type / impl
        target.mkdir(parents=True, exist_ok=True)
        own = {*writes, "requirements.txt"} if extra else set(writes)
        if guard is not None:
            own.add("app.py")
            (target / "app.py").write_text(Path(__file__).with_name(guard).read_text())
        for entry in source.iterdir():
            if entry.name not in own and not entry.name.startswith("."):
                (target / entry.name).symlink_to(entry)
        for folder in writes:
            (target / folder).mkdir(exist_ok=True)
        if extra:
            requirements = source / "requirements.txt"
            text = requirements.read_text() if requirements.is_file() else ""
            lines = "".join(f"{line}\n" for line in extra)
            (target / "requirements.txt").write_text(f"{text.rstrip()}\n{lines}".lstrip())
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
