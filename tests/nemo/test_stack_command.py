"""The NeMo Gym start command per version, without starting anything: 0.4.0 is unchanged
(`ng_run`), 0.7.0 runs `gym env start` with our start deadline as NeMo Gym's own spin-up
timeout, and waives the model-type pairing check only where a resources server declares
`allowed_model_types` (a real config of the 0.7.0 wheel: `asr_with_pc`). That NeMo Gym 0.7.0
refuses such a config without the waiver and accepts it with it was checked with its own
`gym env resolve`; here the configs are NeMo Gym's own files. On 0.6+ the stack gives uvicorn's
worker health check 600 s (NeMo Gym's 30 s kills workers still importing on a loaded machine),
unless the user's config sets it. A restriction that only an included
config declares needs NeMo Gym's resolver: tests/stack/nemo/test_stack_command.py."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from helpers.stacks import PLACEHOLDER_CONFIG as PLACEHOLDER
from helpers.stacks import unstarted_stack as _stack

from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.venv import NeMoGymVenv


def test_nemo_gym_04_starts_with_ng_run_and_no_new_overrides(nemo_venv: NeMoGymVenv):
    configs = Catalog(nemo_venv).env("example_single_tool_call").config_paths
    command = _stack(nemo_venv, configs).command([PLACEHOLDER], 11000, warm=True, deadline=0)
    assert Path(command[0]).name == "ng_run" and command[1].startswith("+config_paths=")
    assert not any("spinup" in a or "pairing" in a or "healthcheck" in a for a in command)


def test_nemo_gym_07_starts_with_gym_env_start_and_our_deadline(nemo_venv_07: NeMoGymVenv):
    configs = Catalog(nemo_venv_07).env("example_single_tool_call").config_paths
    stack = _stack(nemo_venv_07, configs, timeout=300)
    command = stack.command([PLACEHOLDER], 11000, warm=False, deadline=time.monotonic() + 120)
    assert [Path(command[0]).name, *command[1:3]] == ["gym", "env", "start"]
    (spinup,) = [a for a in command if a.startswith("+server_spinup_timeout_seconds=")]
    assert 119 <= int(spinup.split("=")[1]) <= 121  # what is left of our deadline
    assert "+allow_unsupported_pairing=true" not in command  # nothing restricts it here
    assert "+uvicorn_timeout_worker_healthcheck=600" in command


def test_a_users_worker_healthcheck_is_kept(nemo_venv_07: NeMoGymVenv, tmp_path: Path):
    """The stack's worker health-check timeout (uvicorn kills a worker that misses its ping:
    on a loaded machine, one still importing) gives way to one the user's config sets."""
    own = tmp_path / "own.yaml"
    own.write_text("uvicorn_timeout_worker_healthcheck: 45\n")
    configs = [*Catalog(nemo_venv_07).env("example_single_tool_call").config_paths, own]
    command = _stack(nemo_venv_07, configs).command([PLACEHOLDER], 11000, warm=True, deadline=0)
    assert not any("healthcheck" in a for a in command)


def test_pairing_check_waived_only_for_restricted_resources_servers(
    nemo_venv_07: NeMoGymVenv, caplog: pytest.LogCaptureFixture
):
    asr = nemo_venv_07.site_packages / "resources_servers/asr_with_pc/configs/asr_with_pc.yaml"
    plain = Catalog(nemo_venv_07).env("example_single_tool_call").config_paths
    with caplog.at_level(logging.WARNING):
        command = _stack(nemo_venv_07, [*plain, asr]).command(
            [PLACEHOLDER], 11000, warm=True, deadline=time.monotonic() + 60
        )
    assert "+allow_unsupported_pairing=true" in command
    (warning,) = [r.getMessage() for r in caplog.records if "pairing check" in r.getMessage()]
    assert "asr_with_pc: vllm_model, local_vllm_model" in warning
