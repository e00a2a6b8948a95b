"""NeMo Gym's coding-agent harnesses (0.7+): agents that run a CLI which calls the policy itself.

Contract: `harness_agents(configs)` finds the agent instances of merged configs whose type runs
one of the CLIs in `CLIS` (opencode, codex, cline, kilocode, claude_code, pi, openclaw), with the
CLI version the configs pin. `policy_keys(url)` are the global keys NeMo Gym's own env.yaml
defines and these configs read (`${policy_base_url}`, `${policy_api_key}`,
`${policy_model_name}`); `harness_config(agents, capture_dir)` routes every CLI call of a rollout
to that rollout: each harness agent calls NeMo Gym's `policy_model` (a direct agent gets the
`model_server` NeMo Gym accepts for it), and rollout correlation is on, so the URL the agent gives
its CLI is `<policy_model>/ng-rollout/<rollout id>/v1`: the one per-rollout value a CLI carries.
`install_clis(agents)` installs each CLI the way NeMo Gym would (`npm install <package>@<version>`
from the registry) but once per machine and version into this package's cache, never into the
user's global npm prefix, and returns the folders to put first on the stack's PATH, so NeMo Gym's
own install check (`shutil.which`) finds them and installs nothing. `cli_env(...)` is what keeps a
CLI from updating itself mid-run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verifiers_nemogym.errors import StackError
from verifiers_nemogym.nemo.catalog import (
    AGENTS,
    MODELS,
    POLICY_INSTANCE,
    merge_configs,
    rollout_correlation,
    server_blocks,
)
from verifiers_nemogym.util import file_lock, private_cache, run_checked

logger = logging.getLogger(__name__)

POLICY_MODEL_NAME = "policy"
"""`policy_model_name` of our stacks. A stack serves every model its users run (a shared stack,
many env processes), and verifiers' interception sets the model of every call it records to the
one the rollout runs, so the name only labels the CLI's provider settings."""
INSTALL_TIMEOUT = 900.0
"""Seconds one `npm install` of a CLI (or of Node) may take."""


@dataclass(frozen=True)
class Cli:
    """One coding-agent CLI as NeMo Gym's agent of `agent_type` installs and runs it."""

    agent_type: str
    package: str
    """Its npm package."""
    version_field: str
    """The agent config field pinning the package version (None or absent: `latest`)."""
    command: str
    """The executable NeMo Gym's agent looks for on PATH."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment that keeps it from updating itself while rollouts run."""


CLIS: dict[str, Cli] = {
    cli.agent_type: cli
    for cli in (
        Cli("opencode_agent", "opencode-ai", "opencode_version", "opencode",
            {"OPENCODE_DISABLE_AUTOUPDATE": "1"}),
        Cli("codex_agent", "@openai/codex", "codex_version", "codex"),
        # Without it cline runs `npm update --global cline` at each start; concurrent updates
        # delete the binary under running agents.
        Cli("cline_agent", "cline", "cline_version", "cline", {"CLINE_NO_AUTO_UPDATE": "1"}),
        Cli("kilocode_agent", "@kilocode/cli", "kilo_version", "kilo",
            {"KILO_DISABLE_AUTOUPDATE": "1"}),
        Cli("claude_code_agent", "@anthropic-ai/claude-code", "claude_code_version", "claude",
            {"DISABLE_AUTOUPDATER": "1"}),
        Cli("pi_agent", "@earendil-works/pi-coding-agent", "pi_version", "pi"),
        Cli("openclaw_agent", "openclaw", "openclaw_version", "openclaw"),
    )
}  # fmt: skip
"""Agent type -> its CLI (NeMo Gym 0.7.0's `responses_api_agents/<type>/setup_*.py`). Agents
whose CLI comes from outside the npm registry (prime_agent, hermes, nemo_fabric) are not here:
NeMo Gym installs those itself, or fails to."""


@dataclass(frozen=True)
class HarnessAgent:
    """An agent instance of a stack that runs a CLI."""

    instance: str
    cli: Cli
    version: str
    """npm version spec of its CLI (`latest` when the config pins none)."""
    direct: bool
    """The config points the CLI at `${policy_base_url}` itself (no `model_server`)."""


def harness_agents(configs: Iterable[dict[str, Any]]) -> list[HarnessAgent]:
    """The agent instances of `configs` (merged configs, later ones overriding) that run a CLI."""
    found = []
    for instance, (agent_type, block) in server_blocks(merge_configs(configs), AGENTS).items():
        cli = CLIS.get(agent_type)
        if cli is None:
            continue
        version = block.get(cli.version_field)
        found.append(
            HarnessAgent(
                instance=instance,
                cli=cli,
                version=str(version) if version not in (None, "") else "latest",
                direct=not block.get("model_server"),
            )
        )
    return found


def policy_keys(policy_url: str) -> dict[str, str]:
    """The global keys of NeMo Gym's env.yaml for a policy served at `policy_url` (ending in
    `/v1`). The key is per stack and opens nothing: calls are routed, and authenticated, by the
    rollout id in their path (`bridge.wire`)."""
    return {
        "policy_base_url": policy_url,
        "policy_api_key": f"vfng-{secrets.token_hex(8)}",
        "policy_model_name": POLICY_MODEL_NAME,
    }


def harness_config(agents: list[HarnessAgent], capture_dir: Path) -> dict[str, Any]:
    """The config entries that route each harness agent's CLI calls per rollout (module doc);
    empty without harness agents. `capture_dir`: where NeMo Gym's own model servers (a judge)
    write model-call captures once observability is on (it requires one)."""
    if not agents:
        return {}
    config = rollout_correlation(capture_dir)
    for agent in agents:
        if agent.direct:
            model_server = {"type": MODELS, "name": POLICY_INSTANCE}
            config[agent.instance] = {
                AGENTS: {agent.cli.agent_type: {"model_server": model_server}}
            }
    return config


def cli_env() -> dict[str, str]:
    """Environment for a stack running CLIs: each CLI's own no-update switch."""
    env: dict[str, str] = {}
    for cli in CLIS.values():
        env.update(cli.env)
    return env


# ---------------------------------------------------------------------------------- install


def install_clis(
    agents: list[HarnessAgent], deadline: float, log: logging.Logger = logger
) -> list[Path]:
    """Install each agent's CLI (once per machine and package version, in the package cache) and,
    where a CLI needs a newer Node than the machine's, that Node; the folders to put first on
    the stack's PATH. StackError (one line) if npm is missing or an install fails."""
    wanted = sorted({(a.cli.package, a.version): a.cli for a in agents}.items())
    folders: list[Path] = []
    for (_, version), cli in wanted:
        folder = _installed(cli, version, deadline, log)
        folders.append(folder / "bin")
        need = _node_requirement(folder / "node_modules" / cli.package / "package.json")
        if need is not None and not _node_satisfies(_node_version(), need):
            folders.insert(0, _node_for(need, cli, deadline, log))
    return folders


def _npm() -> str:
    npm = shutil.which("npm")
    if npm is None:
        raise StackError(
            "NeMo Gym's coding-agent harnesses need Node.js and npm on PATH to install their CLI"
        )
    return npm


def _installed(cli: Cli, version: str, deadline: float, log: logging.Logger) -> Path:
    """`<cache>/npm/<package>@<version>`, with the package installed and its executables linked
    into `bin/`; built beside and renamed into place, serialised between processes."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", version):
        raise StackError(f"{cli.agent_type}: {cli.version_field} {version!r} is not an npm version")
    root = private_cache("npm")
    name = f"{cli.package.replace('/', '+')}@{version}"
    folder = root / name
    if (folder / "bin" / cli.command).exists():
        return folder
    with file_lock(root / f".{name}.lock"):
        if (folder / "bin" / cli.command).exists():
            return folder
        building = root / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
        building.mkdir()
        try:
            log.info("installing %s@%s for %s (npm, once per machine)", cli.package, version,
                     cli.agent_type)  # fmt: skip
            began = time.monotonic()
            _npm_install(building, f"{cli.package}@{version}", deadline, cli.agent_type)
            _link_bins(building, cli)
            if folder.exists():
                shutil.rmtree(folder)  # a half-built folder of an older version of this code
            os.replace(building, folder)
            log.info("installed %s@%s in %.1f s", cli.package, version, time.monotonic() - began)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return folder


def _npm_install(prefix: Path, spec: str, deadline: float, who: str) -> None:
    left = min(INSTALL_TIMEOUT, deadline - time.monotonic())
    if left <= 0:
        raise StackError(f"{who}: no time left to install {spec} before the start deadline")
    run_checked(
        [_npm(), "install", "--prefix", str(prefix), "--no-save", "--no-audit", "--no-fund",
         "--loglevel=error", spec],
        f"{who}: `npm install {spec}`", left, reason=npm_error,
        # Our prefix only, whatever the user's npm config says.
        env={**os.environ, "NPM_CONFIG_PREFIX": str(prefix), "NPM_CONFIG_GLOBAL": "false"},
    )  # fmt: skip


def npm_error(text: str) -> str:
    """The one line of npm's error output that says what went wrong (not its code, nor where
    its log is)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    said = [re.sub(r"^npm (error|ERR!)\s*", "", ln) for ln in lines if ln.startswith("npm ")]
    useful = [ln for ln in said if ln and not ln.startswith(("code ", "errno ", "A complete log"))]
    return (useful[0] if useful else lines[-1] if lines else "no output")[:300]


def _link_bins(prefix: Path, cli: Cli) -> None:
    """`prefix/bin/<name>` for each executable the package declares (not its dependencies')."""
    manifest = json.loads((prefix / "node_modules" / cli.package / "package.json").read_text())
    bins = manifest.get("bin") or {}
    if isinstance(bins, str):
        bins = {cli.package.rsplit("/", 1)[-1]: bins}
    (prefix / "bin").mkdir()
    for name in bins:
        target = prefix / "node_modules" / ".bin" / name
        if target.exists():
            (prefix / "bin" / name).symlink_to(os.path.relpath(target, prefix / "bin"))
    if not (prefix / "bin" / cli.command).exists():
        raise StackError(
            f"{cli.agent_type}: {cli.package} installs no `{cli.command}` executable "
            f"(it declares {', '.join(bins) or 'none'})"
        )


# ------------------------------------------------------------------------------------- node


def _node_requirement(manifest: Path) -> tuple[int, ...] | None:
    """The lowest Node the package declares it needs (`engines.node` of the form `>=X[.Y[.Z]]`
    or `^X...`), or None."""
    try:
        engines = json.loads(manifest.read_text()).get("engines") or {}
    except (OSError, ValueError):
        return None
    match = re.search(r"(?:>=|\^|~)?\s*v?(\d+(?:\.\d+){0,2})", str(engines.get("node", "")))
    return tuple(int(p) for p in match.group(1).split(".")) if match else None


def _node_version() -> tuple[int, ...]:
    node = shutil.which("node")
    if node is None:
        return ()
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30)
    match = re.match(r"v(\d+)\.(\d+)\.(\d+)", out.stdout.strip())
    return tuple(int(p) for p in match.groups()) if match else ()


def _node_satisfies(have: tuple[int, ...], need: tuple[int, ...]) -> bool:
    return bool(have) and have >= need


def _node_for(need: tuple[int, ...], cli: Cli, deadline: float, log: logging.Logger) -> Path:
    """A folder holding a `node` of major version `need[0]` that satisfies `need`: the Node
    release npm itself distributes (`node-linux-<arch>@<major>`), installed once per machine."""
    arch = {"x86_64": "x64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    package = f"node-linux-{arch}"
    root = private_cache("npm")
    name = f"{package}@{need[0]}"
    folder = root / name
    node = folder / "bin" / "node"
    with file_lock(root / f".{name}.lock"):
        if not node.exists():
            log.info("%s needs Node >= %s; installing %s@%d (npm, once per machine)",
                     cli.package, ".".join(map(str, need)), package, need[0])  # fmt: skip
            building = root / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
            building.mkdir()
            try:
                _npm_install(building, f"{package}@{need[0]}", deadline, cli.agent_type)
                binary = building / "node_modules" / package / "bin" / "node"
                if not binary.exists():
                    raise StackError(f"{cli.agent_type}: {package}@{need[0]} has no bin/node")
                (building / "bin").mkdir()
                (building / "bin" / "node").symlink_to(os.path.relpath(binary, building / "bin"))
                if folder.exists():
                    shutil.rmtree(folder)
                os.replace(building, folder)
            finally:
                shutil.rmtree(building, ignore_errors=True)
    out = subprocess.run([str(node), "--version"], capture_output=True, text=True, timeout=30)
    have = tuple(int(p) for p in re.findall(r"\d+", out.stdout)[:3])
    if not _node_satisfies(have, need):
        raise StackError(
            f"{cli.agent_type}: {cli.package} needs Node >= {'.'.join(map(str, need))}; the "
            f"newest {package}@{need[0]} is {out.stdout.strip() or 'unusable'}"
        )
    return folder / "bin"
