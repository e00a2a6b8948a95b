"""The local model server and `nemo-gym-env eval-local` on bad input: a clear error, and no
server started. The real model through the whole chain is
tests/stack/policies/test_local_model.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers.evals import script

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.nemo.supervisor import processes_with_env
from verifiers_nemogym.policies.local_model import MARKER_ENV_VAR, LocalModelServer


@pytest.mark.parametrize("content", [None, b"not a model"])
def test_bad_gguf_is_a_clear_error_and_starts_nothing(tmp_path: Path, content: bytes | None):
    path = tmp_path / "model.gguf"
    if content is not None:
        path.write_bytes(content)
    server = LocalModelServer(gguf=path)
    with pytest.raises(ConfigError, match=str(path)):
        server.start()
    assert server.pid is None and processes_with_env(f"{MARKER_ENV_VAR}={server.marker}") == []


def test_eval_local_rejects_bad_input_before_starting_anything(tmp_path: Path) -> None:
    cli = script("nemo-gym-env")
    missing = tmp_path / "absent.gguf"
    out = subprocess.run(
        [cli, "eval-local", "--gguf", str(missing)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 2 and str(missing) in out.stderr, out.stderr
    out = subprocess.run(
        [cli, "eval-local", "-n", "0"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 2 and "num_tasks" in out.stderr, out.stderr
