"""Bad input through the env itself that only the package index can tell: a NeMo Gym release
that does not exist fails with one line naming it, and leaves nothing half-made in the cache
(tests/test_bad_input.py has the cases found without reaching anything)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import nemo_gym_env
from verifiers_nemogym.errors import VenvSetupError

ENV = "example_single_tool_call"


# reaches the package index: a release that does not exist
def test_nemo_gym_version_that_cannot_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("VF_NEMOGYM_CACHE", str(tmp_path / "cache"))
    with pytest.raises(VenvSetupError, match=re.escape("nemo-gym==0.0.0.dev999")) as info:
        nemo_gym_env.load_environment(nemo_env=ENV, nemo_gym_version="0.0.0.dev999")
    first = info.value.args[0].splitlines()[0]
    assert first.startswith("fetching the files of nemo-gym==0.0.0.dev999 failed")
    releases = tmp_path / "cache" / "releases"
    assert not [p for p in releases.iterdir() if not p.name.startswith(".")]  # nothing half-made
    assert not (tmp_path / "cache" / "runtimes").exists()  # and no runtime attempted
