"""One install gives everything: the library's wheel, installed with one command into a fresh
venv outside the repository, runs `vf-eval nemo-gym-env` and `nemo-gym-env conformance` on a real
NeMo Gym stack. Nothing is mocked; the model is the scripted policy (in-process here) for the
eval and the replay policy (inside the command) for conformance.

The NeMo Gym runtime comes from the shared cache (`VF_NEMOGYM_CACHE` is inherited, never set
here), so only the wheels and the fresh venv are new.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.evals import read_episodes
from helpers.processes import REPO, gone

from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.policies.scripted import ANSWER, ScriptedPolicy
from verifiers_nemogym.util import find_uv

ENV = "example_single_tool_call"
MODULE = "nemo_gym_env/__init__.py"


# Run by the fresh venv's Python: where both modules come from, and verifiers' own discovery of
# the id `nemo-gym-env` (construction reads the rows; it starts no stack).
PROBE = f"""
import json, nemo_gym_env, verifiers_nemogym
import verifiers.v1 as vf
config = vf.resolve_env_config({{"taskset": {{"id": "nemo-gym-env", "nemo_env": "{ENV}"}}}})
env = vf.load_environment(config)
print(json.dumps([nemo_gym_env.__file__, verifiers_nemogym.__file__, nemo_gym_env.__all__,
                  type(env).__name__, len(list(env.taskset))]))
"""


@dataclass(frozen=True)
class Install:
    """Wheels built from this checkout and a fresh venv holding the library's wheel only."""

    library_wheel: Path
    env_wheel: Path
    venv: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"


def _run(cmd: list[str], *, cwd: Path, timeout: float) -> str:
    """Run a setup command; a failure fails the test with the command's output."""
    done = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_clean_env()
    )
    assert done.returncode == 0, f"{cmd[:3]} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what ties a child to the repository's dev venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.pop("UV_PROJECT_ENVIRONMENT", None)
    return {**env, **extra}


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Install:
    """`uv build` of both packages, then ONE `uv pip install <library wheel>` into a new venv."""
    uv = str(find_uv())
    root = tmp_path_factory.mktemp("install")
    dist = root / "dist"
    _run([uv, "build", "--all-packages", "-o", str(dist)], cwd=REPO, timeout=600)
    (library_wheel,) = dist.glob("verifiers_nemogym-*.whl")
    (env_wheel,) = dist.glob("nemo_gym_env-*.whl")
    venv = root / "venv"
    _run([uv, "venv", "--python", sys.executable, str(venv)], cwd=root, timeout=120)
    python = venv / "bin" / "python"
    _run([uv, "pip", "install", "--python", str(python), str(library_wheel)], cwd=root, timeout=600)
    return Install(library_wheel=library_wheel, env_wheel=env_wheel, venv=venv)


def test_the_library_wheel_alone_provides_the_env_module(install: Install):
    """The fresh venv imports both modules from its own site-packages (not this checkout) and
    `vf.load_environment` finds the env by its id; the env package's wheel carries the very same
    module bytes as the library's."""
    out = _run([str(install.bin / "python"), "-c", PROBE], cwd=install.venv, timeout=300)
    env_file, lib_file, exported, env_class, rows = json.loads(out.splitlines()[-1])
    assert env_class == "NeMoGymEnv" and rows == 5  # vf.load_environment found the env by its id
    site = install.venv / "lib"
    assert Path(env_file).is_relative_to(site) and Path(lib_file).is_relative_to(site), out
    assert "NeMoGymTaskset" in exported and "load_environment" in exported
    assert (install.bin / "vf-eval").exists() and (install.bin / "nemo-gym-env").exists()
    with zipfile.ZipFile(install.library_wheel) as lib, zipfile.ZipFile(install.env_wheel) as env:
        assert lib.read(MODULE) == env.read(MODULE)
        assert lib.read(MODULE) == (REPO / "environments" / "nemo_gym_env" / MODULE).read_bytes()
        assert not [n for n in env.namelist() if n.startswith("verifiers_nemogym/")]
        metadata = env.read(next(n for n in env.namelist() if n.endswith("METADATA"))).decode()
    version = install.library_wheel.name.split("-")[1]
    assert f"Requires-Dist: verifiers-nemogym=={version}" in metadata
    # A direct verifiers requirement, a range: the Hub classifies v1 packages by it.
    (verifiers,) = [r for r in metadata.splitlines() if r.startswith("Requires-Dist: verifiers<")]
    assert "==" not in verifiers, verifiers


def _prerelease() -> tuple[str, str]:
    """The verifiers pre-release requirement tests/run.sh runs the suite on, and its version."""
    lines = (REPO / "tests" / "verifiers-prerelease.txt").read_text().splitlines()
    (requirement,) = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    name, version = requirement.split("==")
    assert name == "verifiers", requirement
    return requirement, version


@pytest.mark.parametrize("route", ["uv-wheels", "pip-wheels", "uv-editable"])
def test_an_installed_verifiers_prerelease_is_kept(install: Install, tmp_path: Path, route: str):
    """prime-rl carries verifiers as an editable checkout with a dev version (0.4.1.devN).
    Installing our package beside an installed pre-release keeps it (our requirement is a
    range, not a pin that would replace it by a release), by each route: `uv pip install` or
    `pip install` of both wheels, `uv pip install -e` of this checkout. The library then loads
    the env by its id under that verifiers."""
    uv = str(find_uv())
    requirement, version = _prerelease()
    venv = tmp_path / "venv"
    seed = ["--seed"] if route == "pip-wheels" else []
    _run([uv, "venv", *seed, "--python", sys.executable, str(venv)], cwd=tmp_path, timeout=120)
    python = str(venv / "bin" / "python")
    _run([uv, "pip", "install", "--python", python, requirement], cwd=tmp_path, timeout=600)
    wheels = [str(install.library_wheel), str(install.env_wheel)]
    install_ours = {
        "uv-wheels": [uv, "pip", "install", "--python", python, *wheels],
        "pip-wheels": [python, "-m", "pip", "install", "--disable-pip-version-check", *wheels],
        "uv-editable": [uv, "pip", "install", "--python", python, "-e", str(REPO)],
    }[route]
    _run(install_ours, cwd=tmp_path, timeout=600)
    show = "import importlib.metadata as m; print(m.version('verifiers'))"
    assert _run([python, "-c", show], cwd=tmp_path, timeout=120).strip() == version
    out = _run([python, "-c", PROBE], cwd=tmp_path, timeout=300)
    _, _, _, env_class, rows = json.loads(out.splitlines()[-1])
    assert env_class == "NeMoGymEnv" and rows == 5


async def _run_tagged(cmd: list[str], cwd: Path, tag: str, timeout: float) -> tuple[int, str, str]:
    """Run `cmd` with `tag` (NAME=value) in its environment, which every descendant inherits."""
    name, value = tag.split("=", 1)
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        cwd=cwd,
        env=_clean_env(**{name: value, "SCRIPTED_KEY": "unused"}),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


async def test_vf_eval_and_conformance_from_the_installed_wheel(
    install: Install, tmp_path: Path, nemo_venv: NeMoGymVenv
):
    """`vf-eval` and `nemo-gym-env conformance --strict` from the installed wheel, at once: the
    same config set, so one of them starts the shared stack (its host from the installed wheel)
    and the other attaches to it (a stack start is the slow tier's main cost); the host stops
    after its idle grace once both left."""
    lines = Catalog(nemo_venv).env(ENV).example_rollouts.read_text().splitlines()
    recorded = len([line for line in lines if line.strip()])
    eval_tag = f"VF_NEMOGYM_TEST_RUN={uuid.uuid4().hex}"
    conformance_tag = f"VF_NEMOGYM_TEST_RUN={uuid.uuid4().hex}"
    conformance = [str(install.bin / "nemo-gym-env"), "conformance", "--strict", ENV]
    async with ScriptedPolicy() as policy:
        vf_eval = [
            str(install.bin / "vf-eval"), "nemo-gym-env", "-m", "scripted",
            "--client.base-url", policy.base_url, "--client.api-key-var", "SCRIPTED_KEY",
            "-n", "2", "--no-push", "-o", str(tmp_path / "out"),
            "--env.taskset.nemo-env", ENV,
        ]  # fmt: skip
        (code, out, err), (c_code, c_out, c_err) = await asyncio.gather(
            _run_tagged(vf_eval, tmp_path, eval_tag, timeout=900),
            _run_tagged(conformance, tmp_path, conformance_tag, timeout=900),
        )
    assert code == 0, (out + err)[-5000:]
    episodes = read_episodes(tmp_path / "out")
    traces = [t for e in episodes for t in e["traces"]]
    assert len(episodes) == 2 and len(traces) == 2
    assert all(e["ok"] for e in episodes), [e["errors"] for e in episodes]
    assert [t["rewards"]["nemo_gym"]["score"] for t in traces] == [1.0, 1.0]
    assert ANSWER in json.dumps(traces[0])  # the policy's answer is in verifiers' trajectory
    assert len(policy.calls) == 4  # tool call + answer per rollout, all through the installed env
    assert c_code == 0, (c_out + c_err)[-5000:]
    assert f"| {ENV} | {recorded} | {recorded} | 0 | {recorded}/{recorded} |" in c_out, c_out
    assert "Mismatches" not in c_out
    # The shared stack's host (started from the installed wheel by one of the two commands)
    # outlives them by its idle grace, then stops everything.
    assert await gone(eval_tag) == []
    assert await gone(conformance_tag) == []


def test_the_env_wheel_next_to_the_library_and_the_cost_of_sharing_a_module(install: Install):
    """Runs last (it changes the venv). Installing the env package's wheel too, as the
    Environments Hub does, overwrites the module with the same bytes, silently; uninstalling the
    env package alone removes the module the library also ships (the README's stated trade-off),
    and reinstalling the library brings it back."""
    uv, python = str(find_uv()), str(install.bin / "python")
    root = install.venv.parent
    dist = str(install.env_wheel.parent)
    done = subprocess.run(
        [uv, "pip", "install", "--python", python, "--find-links", dist, str(install.env_wheel)],
        cwd=root, capture_output=True, text=True, timeout=600, env=_clean_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "more than one package" not in done.stderr, done.stderr
    importing = [python, "-c", "import nemo_gym_env"]
    _run(importing, cwd=root, timeout=120)
    _run([uv, "pip", "uninstall", "--python", python, "nemo-gym-env"], cwd=root, timeout=120)
    gone = subprocess.run(importing, cwd=root, capture_output=True, text=True, timeout=120)
    assert gone.returncode == 1 and "No module named 'nemo_gym_env'" in gone.stderr
    reinstall = [uv, "pip", "install", "--python", python, "--reinstall-package"]
    _run([*reinstall, "verifiers-nemogym", str(install.library_wheel)], cwd=root, timeout=600)
    _run(importing, cwd=root, timeout=120)
