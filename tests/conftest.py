"""Shared fixtures: the real NeMo Gym runtimes (created on first use, then cached).

NeMo Gym 0.7.0 declares Python >= 3.13.14, a CPython security floor no code of it needs; no such
interpreter exists here, so its runtime is built by hand on 3.13.0 below that floor, the way
NeMo Gym's own notes describe (uv's `--python-version` override, and `UV_CONFIG_FILE` for the
per-server installs NeMo Gym runs). `ng07_runtime` is the one place that knows this: swap it for
the package's own opt-in once `ensure_venv` has one.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from verifiers_nemogym.nemo import venv as venv_module
from verifiers_nemogym.nemo.venv import NeMoGymVenv, cache_root, ensure_venv, find_uv

NG07 = "0.7.0"
_PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
NG07_PYTHON = _PYENV / "versions/3.13.0/bin/python3"
"""CPython 3.13.0: below nemo-gym 0.7.0's declared floor (3.13.14), which it runs on."""
NG07_FLOOR = "3.13.14"
VERSIONS = ["0.4.0", "0.7.0-below-floor"]
"""Test ids of the NeMo Gym versions the stack tests run on."""


@dataclass(frozen=True)
class BelowFloorVenv(NeMoGymVenv):
    """A runtime on an interpreter below its nemo-gym's declared Python floor: NeMo Gym's own
    per-server `uv pip install nemo-gym==...` then needs uv told the floor's version."""

    uv_config: Path = Path()

    def env(self, ray_tmpdir: Path | None = None) -> dict[str, str]:
        return super().env(ray_tmpdir) | {"UV_CONFIG_FILE": str(self.uv_config)}


def ng07_runtime() -> BelowFloorVenv:
    """The nemo-gym 0.7.0 runtime on Python 3.13.0, built once into the package's runtime cache
    (where `ensure_venv("0.7.0", <that python>)` then finds it, e.g. in a vf-eval subprocess)."""
    if not NG07_PYTHON.is_file():
        raise RuntimeError(f"NeMo Gym 0.7.0 tests need CPython 3.13.0 at {NG07_PYTHON}")
    root = cache_root() / "runtimes"
    uv_config = cache_root() / f"uv-python-{NG07_FLOOR}.toml"
    uv_config.parent.mkdir(parents=True, exist_ok=True)
    uv_config.write_text(f'[pip]\npython-version = "{NG07_FLOOR}"\n')
    name = f"nemo-gym-{NG07}-py3.13.0"
    target = root / name
    with venv_module._file_lock(root / f".{name}.lock"):
        if venv_module._load_complete(target) is None:
            shutil.rmtree(target, ignore_errors=True)
            tmp = root / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
            uv = str(find_uv())
            env = venv_module._clean_env() | {"UV_PYTHON_DOWNLOADS": "never"}
            try:
                venv_module._run_uv(
                    [uv, "venv", "--relocatable", "--no-project", "--python", str(NG07_PYTHON),
                     str(tmp)], env, "uv venv (3.13.0)",
                )  # fmt: skip
                venv_module._run_uv(
                    [uv, "pip", "install", "--python", str(tmp / "bin/python"),
                     "--python-version", NG07_FLOOR, f"nemo-gym=={NG07}"], env,
                    "installing nemo-gym 0.7.0 below its Python floor",
                )  # fmt: skip
                marker = {
                    "python": str(NG07_PYTHON),
                    "python_version": "3.13.0",
                    "nemo_gym_version": NG07,
                    "created": time.time(),
                }
                (tmp / venv_module._MARKER_NAME).write_text(json.dumps(marker))
                tmp.rename(target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    plain = venv_module._load_complete(target)
    assert plain is not None, f"NeMo Gym 0.7.0 runtime at {target} is incomplete"
    return BelowFloorVenv(
        plain.venv, plain.python, plain.python_version, plain.nemo_gym_version, uv_config
    )


@pytest.fixture(scope="session")
def nemo_venv() -> NeMoGymVenv:
    """The NeMo Gym 0.4.0 runtime venv; the first test run creates it (about a minute)."""
    return ensure_venv()


@pytest.fixture(scope="session")
def nemo_venv_07() -> BelowFloorVenv:
    """The NeMo Gym 0.7.0 runtime, below its declared Python floor (see module doc)."""
    return ng07_runtime()


@pytest.fixture(scope="module", params=VERSIONS)
def any_nemo_venv(request: pytest.FixtureRequest) -> NeMoGymVenv:
    """Each NeMo Gym version the stack tests cover, in turn (module scope: one at a time)."""
    if request.param == "0.4.0":
        return ensure_venv()
    return ng07_runtime()
