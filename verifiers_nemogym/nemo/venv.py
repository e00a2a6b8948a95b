"""The NeMo Gym runtime: a cached uv venv holding `nemo-gym`, used only through subprocesses.

Contract: `ensure_venv()` returns a `NeMoGymVenv` whose venv has `nemo-gym==<version>`
installed for a CPython >= 3.12; it builds it once per (nemo-gym version, Python version) under
`cache_root()` and afterwards returns it without starting any subprocess. This process never
imports `nemo_gym`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from verifiers_nemogym.errors import VenvSetupError

logger = logging.getLogger(__name__)

DEFAULT_NEMO_GYM_VERSION = "0.4.0"
PYTHON_ENV_VAR = "VF_NEMOGYM_PYTHON"
CACHE_ENV_VAR = "VF_NEMOGYM_CACHE"
# NeMo Gym >= 0.2 requires Python >= 3.12 (0.5+ even 3.13); older interpreters are never candidates.
MIN_PYTHON = (3, 12)
# Written inside the venv before it is renamed into place, so "marker present" means "complete".
_MARKER_NAME = "vf-nemogym-runtime.json"
_VERSION_SPEC = re.compile(r"^3\.\d+(\.\d+)?$")
# Variables that would make a child use the parent's venv or Python instead of its own.
_PARENT_ENV_VARS = (
    "VIRTUAL_ENV",
    "PYTHONHOME",
    "PYTHONPATH",
    "UV_PROJECT_ENVIRONMENT",
    "CONDA_PREFIX",
)
_PROBE = "import platform; print(platform.python_implementation(), platform.python_version())"


def cache_root() -> Path:
    """Root of everything this package caches (runtimes, per-server venvs)."""
    if explicit := os.environ.get(CACHE_ENV_VAR):
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "verifiers-nemogym"


def uv_cache_dir() -> Path:
    """uv's own cache folder (uv's default on Linux), shared so per-server venvs build from it."""
    if explicit := os.environ.get("UV_CACHE_DIR"):
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "uv"


def _probe_python(exe: Path) -> str | None:
    """The version of a CPython interpreter, or None if it does not run (e.g. a pyenv shim)."""
    try:
        out = subprocess.run(
            [str(exe), "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=30,
            env=_clean_env(),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = out.stdout.split()
    if out.returncode != 0 or len(parts) != 2 or parts[0] != "CPython":
        return None
    return parts[1]


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:3] if p.isdigit())


def _acceptable(version: str, wanted: str | None) -> bool:
    if _version_tuple(version)[:2] < MIN_PYTHON:
        return False
    return wanted is None or version == wanted or version.startswith(wanted + ".")


def _candidates(wanted: str | None) -> Iterator[Path]:
    """Interpreters to try, most specific first. Versions are checked by running each one."""
    minors = [wanted.rsplit(".", 1)[0] if wanted.count(".") == 2 else wanted] if wanted else []
    minors = minors or ["3.12", "3.13", "3.14"]
    for minor in minors:
        if found := shutil.which(f"python{minor}"):
            yield Path(found)
    # pyenv keeps real interpreters here; its shims on PATH fail unless the version is selected.
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")).expanduser()
    for folder in sorted((pyenv_root / "versions").glob("3.1[2-9]*"), key=lambda p: p.name):
        exe = folder / "bin" / "python3"
        if exe.is_file() and any(folder.name.startswith(m) for m in minors):
            yield exe
    uv = find_uv(required=False)
    if uv is not None:
        for minor in minors:
            try:
                out = subprocess.run(
                    [str(uv), "python", "find", minor],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    env=_clean_env() | {"UV_PYTHON_DOWNLOADS": "never"},
                )
            except (OSError, subprocess.TimeoutExpired):
                continue
            if out.returncode == 0 and out.stdout.strip():
                yield Path(out.stdout.strip())


def find_python(spec: str | None = None) -> Path:
    """Find a CPython >= 3.12 for the runtime venv.

    `spec` (else $VF_NEMOGYM_PYTHON) is a path to an interpreter or a version such as "3.12" or
    "3.12.1". A named interpreter that is unusable is an error (never silently replaced).
    """
    return _find_python_with_version(spec)[0]


def _find_python_with_version(spec: str | None) -> tuple[Path, str]:
    spec = spec or os.environ.get(PYTHON_ENV_VAR) or None
    how_to_name = (
        f"Name one with ${PYTHON_ENV_VAR}=/path/to/python3.12 (or a version like 3.12), "
        "or the `python` field of the environment config."
    )
    if spec is not None and not _VERSION_SPEC.match(spec):
        exe = Path(spec).expanduser()
        if not exe.is_absolute():
            exe = Path(shutil.which(spec) or exe).absolute()
        version = _probe_python(exe) if exe.exists() else None
        if version is None:
            raise VenvSetupError(f"Python interpreter {spec!r} does not exist or does not run.")
        if not _acceptable(version, None):
            raise VenvSetupError(
                f"Python interpreter {spec!r} is {version}; NeMo Gym needs CPython >= "
                f"{'.'.join(map(str, MIN_PYTHON))}. {how_to_name}"
            )
        return exe, version
    tried: list[str] = []
    for exe in _candidates(spec):
        version = _probe_python(exe)
        tried.append(f"{exe} ({version or 'does not run'})")
        if version is not None and _acceptable(version, spec):
            return exe.absolute(), version
    wanted = f"Python {spec}" if spec else "a CPython >= 3.12"
    raise VenvSetupError(
        f"Could not find {wanted} for the NeMo Gym runtime. Tried: "
        f"{'; '.join(tried) or 'python3.12/python3.13 on PATH, pyenv versions, uv python find'}. "
        f"{how_to_name}"
    )


def find_uv(*, required: bool = True) -> Path | None:
    """The `uv` binary: the `uv` Python package's one if installed, else the one on PATH."""
    try:
        from uv import find_uv_bin

        return Path(find_uv_bin())
    except (ImportError, FileNotFoundError):
        pass
    if found := shutil.which("uv"):
        return Path(found)
    if required:
        raise VenvSetupError(
            "`uv` was not found (neither the `uv` Python package nor `uv` on PATH); "
            "install it with `pip install uv`."
        )
    return None


def _clean_env() -> dict[str, str]:
    """The parent's environment minus what would make a child use the parent's venv or Python."""
    env = dict(os.environ)
    for key in _PARENT_ENV_VARS:
        env.pop(key, None)
    return env


@dataclass(frozen=True)
class NeMoGymVenv:
    """A complete NeMo Gym venv and the interpreter it was built from."""

    venv: Path
    """Root of the venv (has bin/ng_run)."""
    python: Path
    """The base interpreter the venv was created with; its folder goes first on PATH."""
    python_version: str
    """Full version of `python`, e.g. "3.12.1" (NeMo Gym pins per-server venvs to it)."""
    nemo_gym_version: str
    """Installed nemo-gym version, e.g. "0.4.0"."""

    @property
    def site_packages(self) -> Path:
        major_minor = ".".join(self.python_version.split(".")[:2])
        return self.venv / "lib" / f"python{major_minor}" / "site-packages"

    def bin(self, name: str) -> Path:
        return self.venv / "bin" / name

    @property
    def server_venvs_dir(self) -> Path:
        """Where NeMo Gym builds its per-server venvs (`+uv_venv_dir`), reused across stacks."""
        return (
            cache_root()
            / "server-venvs"
            / _runtime_name(self.nemo_gym_version, self.python_version)
        )

    def env(self, ray_tmpdir: Path | None = None) -> dict[str, str]:
        """The process environment for NeMo Gym subprocesses.

        `ray_tmpdir` should be private to one stack and short: Ray puts unix sockets below it and
        those paths are limited to ~107 characters.
        """
        env = _clean_env()
        # NeMo Gym runs `uv venv --python <X.Y.Z>` for every server; uv only finds that exact
        # interpreter on PATH (downloads are off), so its folder goes first. uv itself follows.
        path = [str(self.python.parent), str(self.venv / "bin")]
        if (uv := find_uv(required=False)) is not None:
            path.append(str(uv.parent))
        env["PATH"] = os.pathsep.join([*path, env.get("PATH", "")])
        env["UV_PYTHON_DOWNLOADS"] = "never"
        # Ray: loopback only, no phoning home, and never attach to a cluster found elsewhere.
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        env.pop("RAY_ADDRESS", None)
        env["RAY_TMPDIR"] = str(ray_tmpdir or Path("/tmp") / f"vfng-{os.getuid()}")
        # Datasets come from files; a stray hub lookup would only add latency or hang offline.
        env["HF_HUB_OFFLINE"] = "1"
        env["WANDB_MODE"] = "disabled"
        env["PYTHONUNBUFFERED"] = "1"
        return env


def _runtime_name(nemo_gym_version: str, python_version: str) -> str:
    return f"nemo-gym-{nemo_gym_version}-py{python_version}"


def _load_complete(venv: Path) -> NeMoGymVenv | None:
    """The runtime at `venv` if it is complete and its interpreter still exists, else None."""
    try:
        data = json.loads((venv / _MARKER_NAME).read_text())
        runtime = NeMoGymVenv(
            venv=venv,
            python=Path(data["python"]),
            python_version=str(data["python_version"]),
            nemo_gym_version=str(data["nemo_gym_version"]),
        )
    except (OSError, ValueError, KeyError):
        return None
    if not (runtime.python.exists() and runtime.bin("ng_run").exists()):
        return None
    return runtime


def _find_cached(root: Path, version: str, spec: str | None) -> NeMoGymVenv | None:
    """A complete cached runtime matching `spec`, found without running any interpreter."""
    matches: list[NeMoGymVenv] = []
    for venv in root.glob(f"{_runtime_name(version, '3.*')}"):
        runtime = _load_complete(venv)
        if runtime is None or runtime.nemo_gym_version != version:
            continue
        if spec is None:
            matches.append(runtime)
        elif _VERSION_SPEC.match(spec):
            if _acceptable(runtime.python_version, spec):
                matches.append(runtime)
        elif Path(spec).expanduser().absolute() == runtime.python:
            matches.append(runtime)
    # With several candidates prefer the oldest Python: the one most likely to satisfy pins.
    matches.sort(key=lambda r: _version_tuple(r.python_version))
    return matches[0] if matches else None


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock; released by the kernel if this process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run_uv(args: list[str], env: dict[str, str], what: str) -> None:
    try:
        out = subprocess.run(
            args, capture_output=True, text=True, env=env, timeout=1800, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as exc:
        raise VenvSetupError(f"{what} timed out after {exc.timeout:.0f} s") from exc
    if out.returncode != 0:
        tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-30:])
        raise VenvSetupError(f"{what} failed (exit {out.returncode}):\n{tail}")


def ensure_venv(
    version: str = DEFAULT_NEMO_GYM_VERSION,
    python: str | None = None,
    *,
    log: logging.Logger = logger,
) -> NeMoGymVenv:
    """Return the cached NeMo Gym runtime for `version`, creating it on first use.

    `python` is as for `find_python`. Creation is atomic (built in a temporary folder, then
    renamed) and serialised between processes by a file lock.
    """
    python = python or os.environ.get(PYTHON_ENV_VAR) or None
    root = cache_root() / "runtimes"
    if (cached := _find_cached(root, version, python)) is not None:
        return cached

    exe, python_version = _find_python_with_version(python)
    name = _runtime_name(version, python_version)
    target = root / name
    with _file_lock(root / f".{name}.lock"):
        # Another process may have finished it while we waited for the lock.
        if (runtime := _load_complete(target)) is not None:
            return runtime
        if target.exists():
            # Left over from an older layout or a hand-made folder: not ours to trust.
            shutil.rmtree(target)
        uv = find_uv()
        assert uv is not None
        started = time.monotonic()
        log.info("creating NeMo Gym %s runtime with Python %s ...", version, python_version)
        tmp = root / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
        env = _clean_env() | {"UV_PYTHON_DOWNLOADS": "never"}
        try:
            # --relocatable: scripts and activation resolve paths at run time, so the rename
            # below does not break bin/ng_run's shebang.
            _run_uv(
                [str(uv), "venv", "--relocatable", "--no-project", "--python", str(exe), str(tmp)],
                env,
                f"`uv venv` with {exe}",
            )
            _run_uv(
                [str(uv), "pip", "install", "--python", str(tmp / "bin" / "python"),
                 f"nemo-gym=={version}"],
                env,
                f"installing nemo-gym=={version}",
            )  # fmt: skip
            if not (tmp / "bin" / "ng_run").exists():
                raise VenvSetupError(f"nemo-gym=={version} installed no `ng_run` command")
            marker = {
                "python": str(exe),
                "python_version": python_version,
                "nemo_gym_version": version,
                "created": time.time(),
            }
            (tmp / _MARKER_NAME).write_text(json.dumps(marker, indent=2))
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log.info(
            "creating NeMo Gym %s runtime with Python %s ... done in %.1f s",
            version,
            python_version,
            time.monotonic() - started,
        )
    runtime = _load_complete(target)
    if runtime is None:
        raise VenvSetupError(f"NeMo Gym runtime at {target} is incomplete after creation")
    return runtime
