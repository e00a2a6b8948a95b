"""What NeMo Gym environments a runtime ships, read from its files (no `nemo_gym` import).

The only module that knows NeMo Gym's on-disk layout (both environment layouts, `data/*.jsonl`,
model-server folders, the server-config shape `<instance>: {<server type>: {<impl>: {...}}}`) and
reads its config YAML (`load_config` with `file:line:col` errors; `parse_config` for a running
stack's merged config). Configs that include or inherit are merged by NeMo Gym itself
(`nemo.resolver`, cached per runtime and file content); `merge_configs` layers several as NeMo
Gym layers config paths. Everything else asks a `Catalog` for an
`EnvSpec` or `entries()`, and reads server blocks, URLs and `/run` targets through here
(docs/runtime.md).
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import os
import re
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from verifiers_nemogym.errors import ConfigError, NeMoGymError
from verifiers_nemogym.nemo.release import ReleaseFiles
from verifiers_nemogym.nemo.resolver import run_resolver
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.util import private_cache

RESOURCES_SERVERS = "resources_servers"
ENVIRONMENTS = "environments"
AGENTS = "responses_api_agents"
MODELS = "responses_api_models"
ENVIRONMENT_SERVERS = "environment_servers"
"""Servers fronting agents (`Features.environment_servers`): NeMo Gym posts `/run` to them."""
LAYOUTS = (RESOURCES_SERVERS, ENVIRONMENTS)
"""The two places environments live; a name prefixed `<layout>/` picks one explicitly."""
_TOMBSTONE = ".nemo_gym_tombstone"
_MANIFEST = "manifest.yaml"
POLICY_INSTANCE = "policy_model"
POLICY_KEYS = ("policy_base_url", "policy_api_key", "policy_model_name")
"""The global keys of NeMo Gym's env.yaml naming the policy; coding-agent harness configs read
them (`${policy_base_url}` ...), so every config merge and stack defines them."""
PLACEHOLDER_POLICY_VALUE = "unset-by-vf-nemogym"
"""The instance name NeMo Gym's agent configs reference as their model server."""
PLACEHOLDER_IMPL = "vf_external_model"
"""Folder of the placeholder model server we put in ng_run's cwd (cwd wins over the install)."""
_PLACEHOLDER_APP = '''\
"""Placeholder for an external policy model (verifiers-nemogym's proxy).

NeMo Gym needs a process per configured server; the real model server is the proxy at the
configured host/port, which agents call directly. This process only waits to be stopped.
"""

import signal
import sys

signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    signal.pause()
'''
DATASET_KINDS = ("example", "train", "validation")


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset an agent config lists."""

    name: str
    type: str
    """"example", "train" or "validation"."""
    jsonl_path: Path
    """Absolute; relative `jsonl_fpath`s resolve against the runtime's site-packages."""
    gitlab: dict[str, str] | None = None
    """`gitlab_identifier` (dataset_name, version, artifact_fpath) if the config has one."""
    huggingface: dict[str, str] | None = None
    """`huggingface_identifier` (repo_id, artifact_fpath) if the config has one."""

    def how_to_get(self) -> str:
        """A hint for fetching a dataset the wheel does not ship."""
        if self.huggingface and self.huggingface.get("repo_id"):
            artifact = self.huggingface.get("artifact_fpath", f"{self.type}.jsonl")
            return (
                f"download it with `ng_download_dataset_from_hf +repo_id="
                f"{self.huggingface['repo_id']} +artifact_fpath={artifact} "
                "+output_fpath=<file>.jsonl` (a command of the NeMo Gym runtime venv) "
                "and pass that file's path"
            )
        if self.gitlab:
            return (
                f"it lives in NVIDIA's GitLab model registry ({self.gitlab.get('dataset_name')} "
                f"v{self.gitlab.get('version')}), which needs their credentials; "
                "pass the path of a JSONL file you have instead"
            )
        return "pass the path of a JSONL file with rows for this environment (jsonl_path)"


@dataclass(frozen=True)
class AgentSpec:
    """One agent server instance from an environment's config."""

    name: str
    """Top-level key, e.g. "example_single_tool_call_simple_agent" (the `/run` target)."""
    impl: str
    """Folder under responses_api_agents/, e.g. "simple_agent"."""
    config_path: Path
    datasets: list[DatasetSpec] = field(default_factory=list)


@dataclass(frozen=True)
class EnvSpec:
    """A NeMo Gym environment: a resources server folder and the config chosen to run it."""

    name: str
    """The folder name, e.g. "example_single_tool_call" (under `layout`)."""
    root: Path
    config_paths: list[Path]
    """The config(s) to hand to `ng_run` for this environment (see `Catalog.env`)."""
    agents: list[AgentSpec]
    layout: str = RESOURCES_SERVERS
    """`resources_servers` or `environments`."""
    server_datasets: list[DatasetSpec] = field(default_factory=list)
    """Datasets declared on resources servers instead of agents (a few configs do that)."""

    @property
    def agent(self) -> AgentSpec:
        """The default agent: the first one the chosen config defines."""
        return self.agents[0]

    @property
    def example_rollouts(self) -> Path:
        """`data/example_rollouts.jsonl`: rollouts NeMo Gym recorded with a real model (may be
        missing, or hold placeholder lines, for some environments)."""
        return self.root / "data" / "example_rollouts.jsonl"

    def dataset(self, kind: str = "example") -> Path:
        """Path of this environment's `kind` dataset ("example", "train" or "validation").

        "example" falls back to `data/example.jsonl` even when no config lists it (most
        environments ship it). A missing file raises ConfigError saying how to get it.
        """
        if kind not in DATASET_KINDS:
            raise ConfigError(f"unknown dataset kind {kind!r}; expected one of {DATASET_KINDS}")
        declared = [d for a in self.agents for d in a.datasets] + self.server_datasets
        specs = [d for d in declared if d.type == kind]
        for spec in specs:
            if spec.jsonl_path.is_file():
                return spec.jsonl_path
        fallback = self.root / "data" / f"{kind}.jsonl"
        if kind == "example" and fallback.is_file():
            return fallback
        if specs:
            spec = specs[0]
            raise ConfigError(
                f"the {kind} dataset of {self.name!r} is not installed (expected at "
                f"{spec.jsonl_path}); {spec.how_to_get()}"
            )
        raise ConfigError(
            f"{self.name!r} lists no {kind} dataset in {', '.join(map(str, self.config_paths))} "
            f"and ships no {fallback}; pass the path of a JSONL file instead"
        )


def load_config(path: Path) -> dict[str, Any]:
    """A NeMo Gym config YAML file as a mapping of server instances (an empty file is `{}`).

    Raises ConfigError with one line naming the file and, for syntax errors, `file:line:col`."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read NeMo Gym config {path}: {e.strerror or e}") from None
    return parse_config(text, str(path))


def parse_config(text: str, where: str) -> dict[str, Any]:
    """NeMo Gym config YAML `text` (from `where`: a file, or the head server's URL for the
    running stack's merged config) as a mapping. Errors name `where[:line:col]` and the YAML
    problem, never the text itself (the merged config holds secrets in clear)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark else where
        problem = getattr(e, "problem", None) or type(e).__name__
        raise ConfigError(f"{at}: NeMo Gym config is not valid YAML ({problem})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a NeMo Gym config must be a YAML mapping of servers")
    return data


def merge_configs(configs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """`configs` deep-merged in order, later values winning (how NeMo Gym layers config paths)."""
    merged: dict[str, Any] = {}
    for config in configs:
        _merge_into(merged, config)
    return merged


def _merge_into(into: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge_into(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def server_blocks(
    config: dict[str, Any], server_type: str
) -> dict[str, tuple[str, dict[str, Any]]]:
    """Instance name -> (impl, settings) for every `<instance>: {server_type: {impl: {...}}}`
    entry of `config` (a config file's or the running stack's merged config) whose settings
    name an `entrypoint`; other entries (shared settings, other server types) are skipped."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for name, value in config.items():
        if not isinstance(value, dict) or not isinstance(value.get(server_type), dict):
            continue
        inner = value[server_type]
        if len(inner) != 1:
            continue
        impl, settings = next(iter(inner.items()))
        if isinstance(settings, dict) and "entrypoint" in settings:
            found[str(name)] = (str(impl), settings)
    return found


def server_url(settings: dict[str, Any]) -> str | None:
    """`http://<host>:<port>` of a server block's settings (as `server_blocks` returns them), or
    None when the block has no address (NeMo Gym fills both in the running stack's merged
    config; a config file may leave them out)."""
    host, port = settings.get("host"), settings.get("port")
    if not host or not port:
        return None
    host = str(host)
    # An IPv6 literal (`+default_host=::1`) needs brackets in a URL; names and IPv4 do not.
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def server_urls(config: dict[str, Any], server_type: str) -> dict[str, str]:
    """Instance name -> base URL (`server_url`) of every `server_type` block of `config` that
    has an address; blocks without one are left out."""
    found: dict[str, str] = {}
    for name, (_, settings) in server_blocks(config, server_type).items():
        if (url := server_url(settings)) is not None:
            found[name] = url
    return found


def rollout_correlation(capture_dir: Path) -> dict[str, Any]:
    """The config entries that turn NeMo Gym's rollout correlation on: agents then give their CLI
    (on the host or in a container) `<model server>/ng-rollout/<rollout id>/v1`. NeMo Gym
    requires a folder for its own model servers' call captures (a judge's) once it is on."""
    return {"observability_enabled": True, "model_call_capture_dir": str(capture_dir)}


def run_targets(merged: dict[str, Any]) -> dict[str, str]:
    """Agent instance name -> base URL a rollout of that agent posts `/run` to, from a running
    stack's merged config (its head server's `/global_config_dict_yaml`).

    Contract: every agent with an address is a key. Its value is the environment server whose
    `agent_server` names it when there is one (`Features.environment_servers`: NeMo Gym's
    own rollout collection posts `/run` there and the environment server relays to the agent; if
    several name it, the last in the config), else the agent itself (older releases, or an
    agent no environment server fronts). The one place this is decided: a stack started here,
    the shared stack's host and a stack attached by URL all read it from here."""
    agents = server_urls(merged, AGENTS)
    targets = dict(agents)
    for _, settings in server_blocks(merged, ENVIRONMENT_SERVERS).values():
        agent = settings.get("agent_server")
        url = server_url(settings)
        # An environment server without an address, or fronting an agent the stack does not
        # run, cannot take that agent's `/run`: the agent keeps it.
        if isinstance(agent, dict) and agent.get("name") in agents and url is not None:
            targets[str(agent["name"])] = url
    return targets


def write_policy_placeholder(
    workdir: Path, host: str, port: int, policy_keys: dict[str, str] | None = None
) -> Path:
    """Register an external policy model at `host:port` for an `ng_run` started in `workdir`.

    Writes a model-server folder `responses_api_models/<PLACEHOLDER_IMPL>/` (found because
    NeMo Gym looks in its cwd first, for folders that have a requirements.txt) whose process
    only waits to be stopped, and returns the config YAML that names it `policy_model` with that
    host/port: agents then call the model at `host:port` directly. No patch to NeMo Gym.
    `policy_keys`: the global policy keys NeMo Gym's env.yaml would define (the coding-agent
    harness configs read them; `nemo.agent_clis.policy_keys`), else placeholders that only let
    such configs merge."""
    server_dir = workdir / MODELS / PLACEHOLDER_IMPL
    server_dir.mkdir(parents=True, exist_ok=True)
    (server_dir / "app.py").write_text(_PLACEHOLDER_APP)
    (server_dir / "requirements.txt").write_text("# stdlib only; see app.py\n")
    keys = policy_keys or {key: PLACEHOLDER_POLICY_VALUE for key in POLICY_KEYS}
    config: dict[str, Any] = {
        **keys,
        POLICY_INSTANCE: {
            MODELS: {PLACEHOLDER_IMPL: {"entrypoint": "app.py", "host": host, "port": port}}
        },
    }
    path = workdir / f"{PLACEHOLDER_IMPL}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def placeholder_server_venv(server_venvs: Path) -> Path:
    """Where `ng_run` (with `+uv_venv_dir=<server_venvs>`) puts the placeholder model server's
    venv."""
    return server_venvs / MODELS / PLACEHOLDER_IMPL / ".venv"


def _source(entry: dict[str, Any], kind: str) -> dict[str, str] | None:
    """The newer form of a dataset's origin: `source: {type: huggingface|gitlab, ...}`."""
    source = _as_str_dict(entry.get("source"))
    if source is None or source.get("type") != kind:
        return None
    return {k: v for k, v in source.items() if k != "type"}


def _as_str_dict(value: Any) -> dict[str, str] | None:
    if not isinstance(value, dict):
        return None
    return {str(k): str(v) for k, v in value.items()}


@dataclass(frozen=True)
class CatalogEntry:
    """One environment as a cheap scan of the files sees it (for listing; no resolver run)."""

    name: str
    """The name `Catalog.env` takes: the bare folder name, or `environments/<name>` when a
    resources server folder of the same name exists (bare names pick that one)."""
    layout: str
    """`resources_servers` or `environments`."""
    root: Path
    config: Path | None
    """The config `Catalog.env` starts by default (None: nothing to start, see `problem`)."""
    agents: list[str]
    """Agent instances the config file itself defines (included files not followed)."""
    merged: bool
    """The config includes (`config_paths:`) or inherits (`_inherit_from:`): NeMo Gym merges it."""
    problem: str | None = None
    """Why it does not resolve (a moved stub, no config), else None."""
    facts: dict[str, str] = field(default_factory=dict)
    """What the files show about running offline: `judge`, `api_key`, `sandbox`,
    `harness` (reads NeMo Gym's `${policy_*}` keys), `url_requirement` (each with the
    evidence), for `conformance`'s offline classification."""


# NeMo Gym's global policy settings; the coding-agent harness configs read them.
_POLICY_VARS = re.compile(r"\$\{(policy_base_url|policy_api_key|policy_model_name)\}")
_SANDBOX = re.compile(r"sandbox|docker|singularity|apptainer", re.IGNORECASE)
_API_KEY = re.compile(r"^\s*[\w.]*api_key\s*:", re.IGNORECASE | re.MULTILINE)
_URL_REQUIREMENT = re.compile(r"^[^#\n]*(git\+|https?://)[^\s]*", re.MULTILINE)


class Catalog:
    """The environments one NeMo Gym release ships (both layouts), read from a runtime's
    site-packages or from the release's files alone (`release.release_files`).

    Configs that include or inherit are merged by NeMo Gym itself, which needs a runtime:
    `runtime` (called only then) gives it when `source` is the files alone."""

    def __init__(
        self,
        source: NeMoGymVenv | ReleaseFiles,
        runtime: Callable[[], NeMoGymVenv] | None = None,
    ) -> None:
        if isinstance(source, NeMoGymVenv):
            self.root, self.version = source.site_packages, source.nemo_gym_version
            self._runtime: Callable[[], NeMoGymVenv] | None = lambda: source
        else:
            self.root, self.version = source.root, source.version
            self._runtime = runtime

    def config_path(self, path: str | Path) -> Path:
        """A config path as users give it: `~` expanded; relative paths are relative to the
        NeMo Gym install (site-packages), where the packaged configs live."""
        path = Path(path).expanduser()
        return path if path.is_absolute() else self.root / path

    def names(self) -> list[str]:
        """Every resources server folder that has at least one config YAML, sorted."""
        folder = self.root / RESOURCES_SERVERS
        return sorted(
            p.name for p in folder.iterdir() if p.is_dir() and any((p / "configs").glob("*.yaml"))
        )

    def environment_names(self) -> list[str]:
        """Every folder of the top-level `environments/` layout (moved stubs included), sorted;
        empty where the release has none (`Features.environments_layout`)."""
        folder = self.root / ENVIRONMENTS
        if not folder.is_dir():
            return []
        return sorted(
            p.name
            for p in folder.iterdir()
            if p.is_dir()
            and not p.name.startswith(("_", "."))
            and any(p.iterdir())
            and ((p / _TOMBSTONE).is_file() or any(p.glob("*.yaml")))
        )

    def all_names(self) -> list[str]:
        """Every name `env` takes without a prefix: resources servers, then environments."""
        return sorted(set(self.names()) | set(self.environment_names()))

    def entries(self) -> list[CatalogEntry]:
        """Both layouts, cheaply (no resolver run): resources servers, then environments."""
        found = [self._entry(RESOURCES_SERVERS, name) for name in self.names()]
        taken = {e.name for e in found}
        for name in self.environment_names():
            shown = f"{ENVIRONMENTS}/{name}" if name in taken else name
            found.append(self._entry(ENVIRONMENTS, name, shown))
        return found

    def resolve_each(self) -> list[tuple[CatalogEntry, EnvSpec | NeMoGymError]]:
        """Every entry of `entries()` with what `env(name)` gives it: its EnvSpec, or the
        one-line error saying why it does not resolve. Runs NeMo Gym's resolver on every
        include/inherit config (minutes when its cache is cold)."""
        resolved: list[tuple[CatalogEntry, EnvSpec | NeMoGymError]] = []
        for entry in self.entries():
            try:
                resolved.append((entry, self.env(entry.name)))
            except NeMoGymError as e:
                resolved.append((entry, e))
        return resolved

    def env(self, name: str, config: str | None = None) -> EnvSpec:
        """The environment `name`, run with `config` (a file name among its YAMLs, with or
        without ".yaml"; default: see `_default_config`). A bare name is a resources server
        folder if one exists, else an `environments/` folder; `resources_servers/<name>` and
        `environments/<name>` pick the layout. Unknown names raise ConfigError listing close
        matches; a moved stub names its new name."""
        layout, folder, root, configs = self._find(name)
        if config is None:
            chosen = self._default_config(folder, configs, layout, root)
        else:
            wanted = config if config.endswith(".yaml") else f"{config}.yaml"
            matching = [c for c in configs if c.name == wanted]
            if not matching:
                raise ConfigError(
                    f"environment {name!r} has no config {wanted!r}; available: "
                    f"{', '.join(c.name for c in configs)}"
                )
            chosen = matching[0]
        try:
            merged = self.merged_config(chosen)
        except ConfigError as e:
            raise ConfigError(f"environment {name!r}: {e}") from None
        agents = self._agents(chosen, merged)
        if not agents:
            raise ConfigError(
                f"config {chosen} of environment {name!r} defines no agent server "
                f"({AGENTS}); available configs: {', '.join(c.name for c in configs)}"
            )
        return EnvSpec(
            name=folder,
            root=root,
            config_paths=[chosen],
            agents=agents,
            layout=layout,
            server_datasets=self._server_datasets(chosen, merged),
        )

    def check(self, name: str) -> None:
        """Raise the ConfigError `env(name)` raises for an unknown or moved environment, from
        the folder layout alone (no config is read or merged)."""
        self._find(name)

    def _find(self, name: str) -> tuple[str, str, Path, list[Path]]:
        """(layout, folder, root, config YAMLs) of the environment `name` (see `env`)."""
        layout, folder = self._locate(name)
        root = self.root / layout / folder
        configs = self._configs(layout, root)
        if layout == ENVIRONMENTS and (moved := self._moved_to(root)):
            raise ConfigError(
                f"NeMo Gym environment {name!r} moved to {moved!r} (a stub in NeMo Gym "
                f"{self.version}); use {moved!r}"
            )
        if not configs:
            known = self.all_names()
            close = difflib.get_close_matches(folder, known, n=5, cutoff=0.5)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise ConfigError(
                f"unknown NeMo Gym environment {name!r} (NeMo Gym "
                f"{self.version} ships {len(known)}).{hint}"
            )
        return layout, folder, root, configs

    def agent_env(self, agent: str) -> EnvSpec:
        """The environment whose default config defines the agent instance `agent` (as rows
        name it in `agent_ref`). Unknown agents raise ConfigError listing close matches.
        Scans the config files themselves (no resolver run per environment)."""
        owners: dict[str, str] = {}
        for entry in self.entries():
            for spec in entry.agents:
                owners.setdefault(spec, entry.name)
        if agent in owners:
            return self.env(owners[agent])
        close = difflib.get_close_matches(agent, list(owners), n=5, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"no NeMo Gym environment defines the agent {agent!r}; name its environment "
            f"with --env.taskset.nemo-env (or its config with --env.taskset.config-paths).{hint}"
        )

    def merged_config(self, config_path: Path) -> dict[str, Any]:
        """`config_path` as NeMo Gym merges it: the file itself when it neither includes nor
        inherits, else `gym env resolve`'s output (cached on disk, see `_resolve`)."""
        raw = load_config(config_path)
        return self._resolve(config_path) if _needs_merge(raw) else raw

    # -- internals -------------------------------------------------------------------------

    def _locate(self, name: str) -> tuple[str, str]:
        for layout in LAYOUTS:
            if name.startswith(layout + "/"):
                return layout, name[len(layout) + 1 :].strip("/")
        if (self.root / RESOURCES_SERVERS / name / "configs").is_dir():
            return RESOURCES_SERVERS, name
        if (self.root / ENVIRONMENTS / name).is_dir():
            return ENVIRONMENTS, name
        return RESOURCES_SERVERS, name

    def _configs(self, layout: str, root: Path) -> list[Path]:
        if not root.is_dir():
            return []
        if layout == RESOURCES_SERVERS:
            return sorted((root / "configs").glob("*.yaml"))
        return sorted(p for p in root.glob("*.yaml") if p.name != _MANIFEST)

    def _moved_to(self, root: Path) -> str | None:
        try:
            return (root / _TOMBSTONE).read_text(encoding="utf-8").strip() or "another name"
        except OSError:
            return None

    def _manifest_config(self, root: Path) -> Path | None:
        """The config a `manifest.yaml` names (`config_path`, default `config.yaml`)."""
        manifest = root / _MANIFEST
        if not manifest.is_file():
            return None
        data = load_config(manifest)
        relative = str(data.get("config_path") or "config.yaml")
        return (root / relative).resolve()

    def _default_config(self, name: str, configs: list[Path], layout: str, root: Path) -> Path:
        """resources_servers: `configs/<name>.yaml` if present (the NeMo Gym convention),
        otherwise the first YAML, alphabetically, that defines an agent (e.g. equivalence_rule
        -> lc.yaml; some folders also hold helper YAMLs). environments: the manifest's config,
        else `config.yaml`, else the first YAML that defines an agent."""
        if layout == ENVIRONMENTS:
            named = self._manifest_config(root) or root / "config.yaml"
            if named in configs:
                return named
        for path in configs:
            if path.stem == name:
                return path
        for path in configs:
            if server_blocks(load_config(path), AGENTS):
                return path
        return configs[0]

    def _entry(self, layout: str, folder: str, shown: str | None = None) -> CatalogEntry:
        root = self.root / layout / folder
        name = shown or folder
        if layout == ENVIRONMENTS and (moved := self._moved_to(root)):
            return CatalogEntry(name, layout, root, None, [], False, f"moved to {moved}")
        configs = self._configs(layout, root)
        if not configs:
            return CatalogEntry(name, layout, root, None, [], False, "no config YAML")
        try:
            config = self._default_config(folder, configs, layout, root)
            raw = load_config(config)
        except ConfigError as e:
            return CatalogEntry(name, layout, root, None, [], False, str(e))
        agents = list(server_blocks(raw, AGENTS))
        merged = _needs_merge(raw)
        problem = None if agents or merged else f"{config.name} defines no agent server"
        facts = self._facts(config, raw)
        return CatalogEntry(name, layout, root, config, agents, merged, problem, facts)

    def _facts(self, config: Path, raw: dict[str, Any]) -> dict[str, str]:
        """Evidence in the config text and its servers' requirements about offline use."""
        text = config.read_text(encoding="utf-8")
        facts: dict[str, str] = {}
        if "judge_model_server" in text and "should_use_judge: false" not in text:
            facts["judge"] = "an LLM judge model server in its config"
        if _API_KEY.search(text):
            facts["api_key"] = "an API key in its config"
        if _POLICY_VARS.search(text):
            facts["harness"] = "a coding-agent CLI harness not run here yet"
        folders = [self.root / RESOURCES_SERVERS / i for i, _ in server_blocks(
            raw, RESOURCES_SERVERS).values()] + [self.root / AGENTS / i for i, _ in server_blocks(
            raw, AGENTS).values()]  # fmt: skip
        for folder in folders:
            req = folder / "requirements.txt"
            req_text = req.read_text(encoding="utf-8") if req.is_file() else ""
            if m := _URL_REQUIREMENT.search(req_text):
                facts.setdefault("url_requirement", f"requirement {m.group(0).strip()[:80]}")
            if _SANDBOX.search(req_text) or (
                _SANDBOX.search(text) and "sandbox" not in folder.name.lower()
            ):
                facts.setdefault("sandbox", "a sandbox or container in its config/requirements")
        return facts

    def _agents(self, config_path: Path, merged: dict[str, Any]) -> list[AgentSpec]:
        agents: list[AgentSpec] = []
        for key, (impl, settings) in server_blocks(merged, AGENTS).items():
            agents.append(
                AgentSpec(
                    name=str(key),
                    impl=impl,
                    config_path=config_path,
                    datasets=self._datasets(settings),
                )
            )
        return agents

    def _server_datasets(self, config_path: Path, merged: dict[str, Any]) -> list[DatasetSpec]:
        found: list[DatasetSpec] = []
        for _impl, settings in server_blocks(merged, RESOURCES_SERVERS).values():
            found.extend(self._datasets(settings))
        return found

    def _datasets(self, settings: dict[str, Any]) -> list[DatasetSpec]:
        return [
            self._dataset(d)
            for d in settings.get("datasets") or []
            if isinstance(d, dict) and d.get("jsonl_fpath")
        ]

    def _dataset(self, entry: dict[str, Any]) -> DatasetSpec:
        path = Path(str(entry["jsonl_fpath"]))
        # NeMo Gym resolves these against its cwd, then its install root; for the packaged
        # environments the install root (site-packages) is the one that holds the files.
        if not path.is_absolute():
            path = self.root / path
        return DatasetSpec(
            name=str(entry.get("name", "")),
            type=str(entry.get("type", "")),
            jsonl_path=path,
            gitlab=_as_str_dict(entry.get("gitlab_identifier")) or _source(entry, "gitlab"),
            huggingface=_as_str_dict(entry.get("huggingface_identifier"))
            or _source(entry, "huggingface"),
        )

    def _resolve(self, config_path: Path) -> dict[str, Any]:
        """NeMo Gym's own merge of `config_path` (`gym env resolve`, with the placeholder
        policy model it requires), cached under the runtime's name and the file's path and
        content: one run (~10 s) per config file, ever."""
        content = config_path.read_bytes()
        # Keyed by the path inside the release, so a merge made from a runtime's site-packages
        # also serves the release's files alone (same wheel, same bytes).
        where = str(config_path.relative_to(self.root) if config_path.is_relative_to(self.root)
                    else config_path)  # fmt: skip
        key = hashlib.sha256(where.encode() + b"\0" + content).hexdigest()[:24]
        # Checked before use: a planted merge would be started as this config.
        folder = private_cache("resolved", f"nemo-gym-{self.version}")
        cached = folder / f"{key}.yaml"
        if cached.is_file():
            return parse_config(cached.read_text(encoding="utf-8"), str(cached))
        if self._runtime is None:
            raise ConfigError(
                f"{config_path} includes or inherits other configs, which only NeMo Gym's "
                "runtime can merge"
            )
        venv = self._runtime()
        if config_path.is_relative_to(self.root):  # merge the runtime's copy of the file
            config_path = venv.site_packages / config_path.relative_to(self.root)
        work = folder / "work"
        placeholder = write_policy_placeholder(work, "127.0.0.1", 1)
        text = run_resolver(venv, config_path, placeholder, work)
        merged = parse_config(text, f"`gym env resolve` of {config_path}")
        tmp = folder / f".{key}.{uuid.uuid4().hex[:8]}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, cached)
        return merged


def _needs_merge(raw: dict[str, Any]) -> bool:
    """A config NeMo Gym must merge: it includes others or a block inherits from another."""
    if raw.get("config_paths"):
        return True
    return any(
        isinstance(block, dict) and "_inherit_from" in block
        for value in raw.values()
        if isinstance(value, dict)
        for block in [value, *value.values()]
    )
