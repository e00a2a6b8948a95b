"""The command that starts a NeMo Gym stack: the release's start CLI and its hydra overrides.

Contract: `start_command` is a pure function of the runtime, the configs and the stack's
settings; what differs between releases is read from `release.features` (the start CLI, NeMo
Gym's own start deadline, the model-type pairing check), never from a version number.
`model_type_restrictions` says which resources servers of merged configs restrict their model
servers' types (what the pairing check would refuse our placeholder for).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from verifiers_nemogym.nemo.catalog import RESOURCES_SERVERS, server_blocks
from verifiers_nemogym.nemo.release import features
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.util import uv_cache_dir

_ALLOWED_MODEL_TYPES = "allowed_model_types"


def _hydra_quote(text: str) -> str:
    """A quoted hydra string: one value whatever it holds (commas, brackets, colons)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _hydra_list(paths: list[Path]) -> str:
    """A hydra list literal; quoted so paths with commas or spaces stay one element."""
    return "[" + ",".join(_hydra_quote(str(p)) for p in paths) + "]"


def start_command(
    venv: NeMoGymVenv,
    config_paths: list[Path],
    head_port: int,
    *,
    warm: bool,
    deadline: float,
    ray_address: str | None = None,
    waive_pairing: bool = False,
) -> list[str]:
    """The start command of a stack of `config_paths` (later ones win) with its head server on
    `head_port`: `warm` skips per-server venvs already present, `deadline` (a `time.monotonic()`
    value) is also NeMo Gym's own where it has one, `ray_address` a Ray cluster to join, and
    `waive_pairing` lifts the model-type pairing check where the release has one."""
    has = features(venv.nemo_gym_version)
    # `ng_run` became a deprecated shim for `gym env start` (same overrides).
    start = [str(venv.bin("gym")), "env", "start"] if has.gym_cli else [str(venv.bin("ng_run"))]
    command = [
        *start,
        f"+config_paths={_hydra_list(config_paths)}",
        "+head_server.host=127.0.0.1",
        f"+head_server.port={head_port}",
        # NeMo Gym's default is already loopback unless use_absolute_ip; say so explicitly.
        "+default_host=127.0.0.1",
        f"+uv_venv_dir={venv.server_venvs_dir}",
        f"+skip_venv_if_present={str(warm).lower()}",
        f"+uv_cache_dir={uv_cache_dir()}",
    ]
    if ray_address is not None:
        # NeMo Gym's head and every server then `ray.init` this address (0.4-0.7).
        command.append(f"+ray_head_node_address={_hydra_quote(ray_address)}")
    if has.spinup_timeout:
        # NeMo Gym's own start deadline (default 600 s) would otherwise cut ours short, or
        # outlive it: give it what is left of ours, so both end the start at the same time.
        left = max(1, int(deadline - time.monotonic()) + 1)
        command.append(f"+server_spinup_timeout_seconds={left}")
    if has.pairing_check and waive_pairing:
        command.append("+allow_unsupported_pairing=true")
    return command


def model_type_restrictions(merged: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Resources servers of the `merged` configs that declare `allowed_model_types`, with them,
    as NeMo Gym merges the configs (a declaration may come from an included config or an
    inherited block)."""
    found: dict[str, list[str]] = {}
    for config in merged:
        for name, (_, settings) in server_blocks(config, RESOURCES_SERVERS).items():
            if allowed := settings.get(_ALLOWED_MODEL_TYPES):
                found[name] = [allowed] if isinstance(allowed, str) else list(map(str, allowed))
    return dict(sorted(found.items()))
