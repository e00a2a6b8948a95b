"""Shared fixtures: the real NeMo Gym runtime (created on first use, then cached)."""

from __future__ import annotations

import pytest

from verifiers_nemogym.nemo.venv import NeMoGymVenv, ensure_venv


@pytest.fixture(scope="session")
def nemo_venv() -> NeMoGymVenv:
    """The NeMo Gym 0.4.0 runtime venv; the first test run creates it (about a minute)."""
    return ensure_venv()


@pytest.fixture(scope="session")
def nemo_venv_07() -> NeMoGymVenv:
    """The NeMo Gym 0.7.0 runtime, built with the below-floor opt-in (no Python >= 3.13.14
    here; 0.7.0 declares that CPython security floor). A few seconds from a warm uv cache."""
    return ensure_venv("0.7.0", allow_below_floor=True)
