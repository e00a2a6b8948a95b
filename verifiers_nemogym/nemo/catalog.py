"""What NeMo Gym environments a runtime ships, read from its files (no `nemo_gym` import).

Contract: the only module that knows NeMo Gym's on-disk layout (`resources_servers/<env>/
configs/*.yaml`, `data/*.jsonl`, `responses_api_models/<impl>/`, relative config paths) and its
server-config shape (`<instance>: {<server type>: {<impl>: {...}}}`), and the only one that
reads NeMo Gym's config YAML (`load_config` for files, with `file:line:col` errors;
`parse_config` for the running stack's merged config). Everything else asks a `Catalog` for an
`EnvSpec` and gets absolute paths back, reads server blocks through `server_blocks`, and
registers the external policy model with `write_policy_placeholder`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.nemo.venv import NeMoGymVenv

RESOURCES_SERVERS = "resources_servers"
AGENTS = "responses_api_agents"
MODELS = "responses_api_models"
POLICY_INSTANCE = "policy_model"
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
    license: str | None = None

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
    """Folder name under resources_servers/, e.g. "example_single_tool_call"."""
    root: Path
    config_paths: list[Path]
    """The config(s) to hand to `ng_run` for this environment (see `Catalog.env`)."""
    agents: list[AgentSpec]
    available_configs: list[Path] = field(default_factory=list)
    """Every YAML in configs/, for error messages and for picking another one."""

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
        specs = [d for a in self.agents for d in a.datasets if d.type == kind]
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


def write_policy_placeholder(workdir: Path, host: str, port: int) -> Path:
    """Register an external policy model at `host:port` for an `ng_run` started in `workdir`.

    Writes a model-server folder `responses_api_models/<PLACEHOLDER_IMPL>/` (found because
    NeMo Gym looks in its cwd first, for folders that have a requirements.txt) whose process
    only waits to be stopped, and returns the config YAML that names it `policy_model` with that
    host/port: agents then call the model at `host:port` directly. No patch to NeMo Gym."""
    server_dir = workdir / MODELS / PLACEHOLDER_IMPL
    server_dir.mkdir(parents=True, exist_ok=True)
    (server_dir / "app.py").write_text(_PLACEHOLDER_APP)
    (server_dir / "requirements.txt").write_text("# stdlib only; see app.py\n")
    config = {
        POLICY_INSTANCE: {
            MODELS: {PLACEHOLDER_IMPL: {"entrypoint": "app.py", "host": host, "port": port}}
        }
    }
    path = workdir / f"{PLACEHOLDER_IMPL}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def placeholder_server_venv(venv: NeMoGymVenv) -> Path:
    """Where `ng_run` (with `+uv_venv_dir`) puts the placeholder model server's venv."""
    return venv.server_venvs_dir / MODELS / PLACEHOLDER_IMPL / ".venv"


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


class Catalog:
    """The environments shipped in one runtime's site-packages."""

    def __init__(self, venv: NeMoGymVenv) -> None:
        self.venv = venv
        self.root = venv.site_packages

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

    def env(self, name: str, config: str | None = None) -> EnvSpec:
        """The environment `name`, run with `config` (a file name in its configs/, with or
        without ".yaml"; default: see `_default_config`). Unknown names raise ConfigError
        listing close matches."""
        root = self.root / RESOURCES_SERVERS / name
        configs = sorted((root / "configs").glob("*.yaml")) if root.is_dir() else []
        if not configs:
            known = self.names()
            close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise ConfigError(
                f"unknown NeMo Gym environment {name!r} (NeMo Gym "
                f"{self.venv.nemo_gym_version} ships {len(known)}).{hint}"
            )
        if config is None:
            chosen = self._default_config(name, configs)
        else:
            wanted = config if config.endswith(".yaml") else f"{config}.yaml"
            matching = [c for c in configs if c.name == wanted]
            if not matching:
                raise ConfigError(
                    f"environment {name!r} has no config {wanted!r}; available: "
                    f"{', '.join(c.name for c in configs)}"
                )
            chosen = matching[0]
        agents = self._agents(chosen)
        if not agents:
            raise ConfigError(
                f"config {chosen} of environment {name!r} defines no agent server "
                f"({AGENTS}); available configs: {', '.join(c.name for c in configs)}"
            )
        return EnvSpec(
            name=name,
            root=root,
            config_paths=[chosen],
            agents=agents,
            available_configs=configs,
        )

    def agent_env(self, agent: str) -> EnvSpec:
        """The environment whose default config defines the agent instance `agent` (as rows
        name it in `agent_ref`). Unknown agents raise ConfigError listing close matches."""
        owners: dict[str, str] = {}
        for name in self.names():
            root = self.root / RESOURCES_SERVERS / name
            path = root / "configs" / f"{name}.yaml"
            for spec in self._agents(path) if path.is_file() else []:
                owners.setdefault(spec.name, name)
        if agent in owners:
            return self.env(owners[agent])
        close = difflib.get_close_matches(agent, list(owners), n=5, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"no NeMo Gym environment defines the agent {agent!r}; name its environment "
            f"with --env.taskset.nemo-env (or its config with --env.taskset.config-paths).{hint}"
        )

    def _default_config(self, name: str, configs: list[Path]) -> Path:
        """`configs/<name>.yaml` if present (the NeMo Gym convention); otherwise the first YAML,
        alphabetically, that defines an agent (e.g. equivalence_rule -> lc.yaml). Some folders
        also hold helper YAMLs (judge models, prompt templates) that define no agent."""
        for path in configs:
            if path.stem == name:
                return path
        for path in configs:
            if self._agents(path):
                return path
        return configs[0]

    def _agents(self, config_path: Path) -> list[AgentSpec]:
        agents: list[AgentSpec] = []
        for key, (impl, settings) in server_blocks(load_config(config_path), AGENTS).items():
            datasets = [
                self._dataset(d, config_path)
                for d in settings.get("datasets") or []
                if isinstance(d, dict) and d.get("jsonl_fpath")
            ]
            agents.append(
                AgentSpec(name=str(key), impl=impl, config_path=config_path, datasets=datasets)
            )
        return agents

    def _dataset(self, entry: dict[str, Any], config_path: Path) -> DatasetSpec:
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
            license=str(entry["license"]) if entry.get("license") else None,
        )
