"""Helpers shared by the tests (imported by conftest.py and by test modules as `helpers`).

Process checks read /proc through `verifiers_nemogym.nemo.supervisor.processes_with_env`, the
scan the stack itself uses: every process a stack or a local model server starts carries a
marker variable in its environment, and so does every descendant of a tagged process.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verifiers_nemogym.nemo import venv as venv_module
from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR as STACK_MARKER_VAR
from verifiers_nemogym.nemo.supervisor import processes_with_env
from verifiers_nemogym.nemo.venv import NeMoGymVenv, cache_root, find_uv
from verifiers_nemogym.policies.local_model import MARKER_ENV_VAR as MODEL_MARKER_VAR
from verifiers_nemogym.policies.scripted import ScriptedPolicy

if TYPE_CHECKING:
    import verifiers.v1 as vf

TEST_RUN_VAR = "VF_NEMOGYM_TEST_RUN"
"""Tag a test puts on a subprocess it starts; every descendant inherits it."""
SESSION_VAR = "VF_NEMOGYM_TEST_SESSION"
"""Tag of the whole pytest session, set in conftest: it finds what this session started among
the stacks other people run on the same machine."""


@dataclass
class Launches:
    """Markers of the stacks and model servers the current test started in this process
    (recorded by conftest's `launches` fixture)."""

    stacks: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)


def run_tag() -> tuple[str, dict[str, str]]:
    """A fresh `VF_NEMOGYM_TEST_RUN=<hex>` entry, and this process's environment plus it."""
    value = uuid.uuid4().hex
    return f"{TEST_RUN_VAR}={value}", {**os.environ, TEST_RUN_VAR: value}


def launched_processes(entry: str) -> list[int]:
    """PIDs of live processes carrying `entry` that belong to a NeMo Gym stack or a local model
    server (their environment has the stack's or the model server's marker variable)."""
    keys = (f"{STACK_MARKER_VAR}=".encode(), f"{MODEL_MARKER_VAR}=".encode())
    found = []
    for pid in processes_with_env(entry):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # exited meanwhile
            continue
        if any(item.startswith(keys) for item in environ):
            found.append(pid)
    return found


async def gone(entry: str, seconds: float = 30) -> list[int]:
    """Wait (bounded) until no process carries `entry`; return the survivors."""
    deadline = time.monotonic() + seconds
    while (alive := processes_with_env(entry)) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    return alive


def wait_gone(pids: list[int] | int, seconds: float) -> bool:
    """Block (bounded) until every PID in `pids` has exited (zombies count as exited)."""
    deadline = time.monotonic() + seconds
    pids = [pids] if isinstance(pids, int) else pids
    while True:
        alive = []
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
            except OSError:
                continue
            if state != "Z":
                alive.append(pid)
        if not alive:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def script(name: str) -> str:
    """Path of a console script (`vf-eval`, `nemo-gym-env`) of the test interpreter's venv."""
    return str(Path(sys.executable).with_name(name))


def read_episodes(outdir: Path) -> list[dict[str, Any]]:
    """The episodes of the one run `vf-eval -o outdir` wrote (`<run>/traces.jsonl`)."""
    (traces_file,) = outdir.glob("*/traces.jsonl")
    return [json.loads(line) for line in traces_file.read_text().splitlines() if line.strip()]


def model_context(policy: ScriptedPolicy) -> vf.ModelContext:
    """The verifiers model context that sends a rollout's model calls to `policy`."""
    # Imported here: verifiers takes seconds to import, and the fast tier's inner sessions
    # (tests/test_tiers.py) load this module without needing it.
    import verifiers.v1 as vf
    from verifiers.v1.configs.client import EvalClientConfig

    client = EvalClientConfig(base_url=policy.base_url, api_key_var="SCRIPTED_KEY")
    return vf.ModelContext(model="scripted", client=client)


# --- NeMo Gym 0.7.0 below its declared Python floor -----------------------------------------
# NeMo Gym 0.7.0 declares Python >= 3.13.14, a CPython security floor no code of it needs; no
# such interpreter exists here, so its runtime is built by hand on 3.13.0 below that floor, the
# way NeMo Gym's own notes describe (uv's `--python-version` override, and `UV_CONFIG_FILE` for
# the per-server installs NeMo Gym runs). `ng07_runtime` is the one place that knows this: swap
# it for the package's own opt-in once `ensure_venv` has one.

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
