"""The NeMo Gym 0.7.0 start command for a config that only includes a restricted resources
server (`asr_with_pc`, whose `allowed_model_types` excludes our model type): the restriction is
only seen through NeMo Gym's own config resolver, and the pairing check is still waived. The
start command of plain configs is tests/nemo/test_stack_command.py."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from helpers.stacks import PLACEHOLDER_CONFIG as PLACEHOLDER
from helpers.stacks import unstarted_stack as _stack

from verifiers_nemogym.nemo.venv import NeMoGymVenv


# runs NeMo Gym's config resolver (~10-30 s, cached)
def test_pairing_declared_in_an_included_config_is_seen(
    nemo_venv_07: NeMoGymVenv, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """A config that only includes (`config_paths:`) the restricted one: the restriction lives
    in NeMo Gym's merge of it, not in the file (NeMo Gym's resolver refuses the pairing unless
    told, so the catalog's merge must not trip over it either)."""
    asr = nemo_venv_07.site_packages / "resources_servers/asr_with_pc/configs/asr_with_pc.yaml"
    including = tmp_path / "includes_asr.yaml"
    including.write_text(f"config_paths:\n  - {asr}\n")
    with caplog.at_level(logging.WARNING):
        command = _stack(nemo_venv_07, [including]).command(
            [PLACEHOLDER], 11000, warm=True, deadline=time.monotonic() + 60
        )
    assert "+allow_unsupported_pairing=true" in command
    (warning,) = [r.getMessage() for r in caplog.records if "pairing check" in r.getMessage()]
    assert "asr_with_pc: vllm_model, local_vllm_model" in warning
