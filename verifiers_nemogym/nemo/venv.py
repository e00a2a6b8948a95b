"""The NeMo Gym runtime: a cached uv venv holding `nemo-gym`, used only through subprocesses.

`ensure_venv()` builds it once per (nemo-gym version, Python version, below-floor opt-in) under
`cache_root()` for a base CPython (never a venv's interpreter, which NeMo Gym's per-server
`uv venv` cannot use) meeting the release's Python floor, and afterwards returns it without
starting a subprocess; `default_version()` picks the newest release an interpreter here meets.
This process never imports `nemo_gym` (docs/runtime.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from verifiers_nemogym.errors import StackError, VenvSetupError
from verifiers_nemogym.nemo.release import (
    DEFAULT_NEMO_GYM_VERSION,
    MIN_PYTHON,
    RELEASES,
    floor_text,
    floor_version,
    parse_version,
    python_floor,
    release_files,
)
from verifiers_nemogym.nemo.supervisor import cwd_of, pids
from verifiers_nemogym.util import (
    acquire_flock,
    cache_root,
    clean_env,
    file_lock,
    find_uv,
    private_cache,
    run_uv,
    try_flock,
)

logger = logging.getLogger(__name__)

PYTHON_ENV_VAR = "VF_NEMOGYM_PYTHON"
BELOW_FLOOR_ENV_VAR = "VF_NEMOGYM_ALLOW_PYTHON_BELOW_FLOOR"
BELOW_FLOOR_HOW = (
    "--env.taskset.allow-python-below-floor, $VF_NEMOGYM_ALLOW_PYTHON_BELOW_FLOOR=1 or "
    "`nemo-gym-env --allow-python-below-floor`"
)
# Written inside the venv before it is renamed into place, so "marker present" means "complete".
_MARKER_NAME = "vf-nemogym-runtime.json"
_VERSION_SPEC = re.compile(r"^3\.\d+(\.\d+)?$")
_PROBE = "import platform; print(platform.python_implementation(), platform.python_version())"


def base_interpreter(exe: Path) -> Path:
    """The interpreter a virtual environment's `exe` was made from (its `pyvenv.cfg` `home`,
    followed through nested venvs), else `exe` itself. NeMo Gym runs `uv venv --python X.Y.Z`
    for every server, and uv does not accept an interpreter inside a venv: the runtime must be
    built from, and put first on PATH, the base interpreter (what prime-rl and `uv run` run
    from is a venv's `bin/python`). Read from files only; nothing is run."""
    exe = exe.absolute()
    for _ in range(8):  # a venv made from a venv's interpreter: follow the chain, boundedly
        cfg = exe.parent.parent / "pyvenv.cfg"
        if exe.parent.name != "bin" or not cfg.is_file():
            return exe
        home = _pyvenv_home(cfg)
        if home is None:
            return exe
        names = [exe.name, exe.resolve().name, "python3", "python"]
        found = next((home / n for n in names if (home / n).is_file()), None)
        if found is None:
            return exe
        exe = found
    return exe


def _pyvenv_home(cfg: Path) -> Path | None:
    try:
        for line in cfg.read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                return Path(value.strip())
    except OSError:
        return None
    return None


def _probe_python(exe: Path) -> str | None:
    """The version of a CPython interpreter, or None if it does not run (e.g. a pyenv shim)."""
    try:
        out = subprocess.run(
            [str(exe), "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=30,
            env=clean_env(),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = out.stdout.split()
    if out.returncode != 0 or len(parts) != 2 or parts[0] != "CPython":
        return None
    return parts[1]


def _satisfies(version: str, floor: tuple[int, ...]) -> bool:
    have = parse_version(version)
    return have >= floor_version(floor) and have >= floor_version(MIN_PYTHON)


def _below_floor_ok(version: str, floor: tuple[int, ...]) -> bool:
    """An interpreter the opt-in accepts: the floor's minor version, below its patch level
    (wheels are built per minor version; an older minor could not load them)."""
    return parse_version(version).release[:2] == floor[:2] and not _satisfies(version, floor)


def allow_below_floor_default() -> bool:
    """The opt-in from `$VF_NEMOGYM_ALLOW_PYTHON_BELOW_FLOOR` (1/true/yes)."""
    return os.environ.get(BELOW_FLOOR_ENV_VAR, "").strip().lower() in ("1", "true", "yes")


def _acceptable(version: str, wanted: str | None, floor: tuple[int, ...] = MIN_PYTHON) -> bool:
    if parse_version(version).release[:2] < MIN_PYTHON:
        return False
    if not (_satisfies(version, floor) or _below_floor_ok(version, floor)):
        return False
    return wanted is None or version == wanted or version.startswith(wanted + ".")


def _candidates(wanted: str | None, *, ask_uv: bool = True) -> Iterator[Path]:
    """Interpreters to try, most specific first. Versions are checked by running each one.
    `ask_uv=False` skips `uv python find` (seconds where pyenv shims trip it up)."""
    minors = [wanted.rsplit(".", 1)[0] if wanted.count(".") == 2 else wanted] if wanted else []
    minors = minors or ["3.12", "3.13", "3.14", "3.15"]
    for minor in minors:
        if found := shutil.which(f"python{minor}"):
            yield Path(found)
    # pyenv keeps real interpreters here; its shims on PATH fail unless the version is selected.
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")).expanduser()
    for folder in sorted((pyenv_root / "versions").glob("3.1[2-9]*"), key=lambda p: p.name):
        exe = folder / "bin" / "python3"
        if exe.is_file() and any(folder.name.startswith(m) for m in minors):
            yield exe
    # uv-managed interpreters (`uv python install`), found without running uv.
    xdg_data = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    managed = Path(os.environ.get("UV_PYTHON_INSTALL_DIR") or xdg_data / "uv" / "python")
    for folder in sorted(managed.expanduser().glob("cpython-3.1[2-9]*"), key=lambda p: p.name):
        exe = folder / "bin" / "python3"
        if exe.is_file() and any(folder.name.startswith(f"cpython-{m}") for m in minors):
            yield exe
    uv = find_uv(required=False) if ask_uv else None
    if uv is not None:
        for minor in minors:
            try:
                out = subprocess.run(
                    [str(uv), "python", "find", minor],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    env=clean_env() | {"UV_PYTHON_DOWNLOADS": "never"},
                )
            except (OSError, subprocess.TimeoutExpired):
                continue
            if out.returncode == 0 and out.stdout.strip():
                yield Path(out.stdout.strip())


def check_interpreter(spec: str) -> None:
    """`VenvSetupError` if `spec` names an interpreter by path (not a version such as "3.12")
    that does not exist or does not run: found when the config is read, not at stack start."""
    if _VERSION_SPEC.match(spec):
        return
    exe = Path(spec).expanduser()
    if not exe.is_absolute():
        exe = Path(shutil.which(spec) or exe).absolute()
    if not exe.exists() or _probe_python(exe) is None:
        raise VenvSetupError(f"Python interpreter {spec!r} does not exist or does not run.")


def find_python_for(
    spec: str | None,
    *,
    floor: tuple[int, ...] = MIN_PYTHON,
    allow_below_floor: bool = False,
    what: str = "NeMo Gym",
) -> tuple[Path, str, bool]:
    """(interpreter, its version, whether it is below `floor`): a CPython >= `floor` (default
    3.12) for the runtime venv, as its base interpreter (never a venv's, see
    `base_interpreter`).

    `spec` (else $VF_NEMOGYM_PYTHON) is a path to an interpreter or a version such as "3.12" or
    "3.12.1". A named interpreter that is unusable is an error (never silently replaced). With
    `allow_below_floor`, an interpreter of the floor's minor version below its patch level is
    accepted when none meets the floor. `what` names the release in errors."""
    spec = spec or os.environ.get(PYTHON_ENV_VAR) or None
    floor_str = floor_text(floor)
    how_to_name = (
        f"Name one with ${PYTHON_ENV_VAR}=/path/to/python{'.'.join(map(str, floor[:2]))} "
        "(or a version like "
        f"{'.'.join(map(str, floor[:2]))}), or the `python` field of the environment config."
    )

    def below_floor_error(found: str) -> VenvSetupError:
        return VenvSetupError(
            f"{what} declares Python >= {floor_str} but the best interpreter found is "
            f"{found}; install Python >= {floor_str} (uv python install {floor_str}), or opt "
            f"in to run below the declared floor with {BELOW_FLOOR_HOW} (uv then installs as "
            f"for Python {floor_str})."
        )

    if spec is not None and not _VERSION_SPEC.match(spec):
        exe = Path(spec).expanduser()
        if not exe.is_absolute():
            exe = Path(shutil.which(spec) or exe).absolute()
        version = _probe_python(exe) if exe.exists() else None
        if version is None:
            raise VenvSetupError(f"Python interpreter {spec!r} does not exist or does not run.")
        if _satisfies(version, floor):
            return base_interpreter(exe), version, False
        if _below_floor_ok(version, floor):
            if allow_below_floor:
                return base_interpreter(exe), version, True
            raise below_floor_error(f"{exe} ({version})")
        raise VenvSetupError(
            f"Python interpreter {spec!r} is {version}; {what} needs CPython >= "
            f"{floor_str}. {how_to_name}"
        )
    tried: list[str] = []
    below: list[tuple[Path, str]] = []
    for exe in _candidates(spec):
        version = _probe_python(exe)
        tried.append(f"{exe} ({version or 'does not run'})")
        if version is None or not _acceptable(version, spec, floor):
            continue
        if _satisfies(version, floor):
            return base_interpreter(exe), version, False
        below.append((base_interpreter(exe), version))
    if below:
        # The newest patch release below the floor: the one with the most security fixes.
        exe, version = max(below, key=lambda item: parse_version(item[1]))
        if allow_below_floor:
            return exe, version, True
        raise below_floor_error(f"{exe} ({version})")
    wanted = f"Python {spec}" if spec else f"a CPython >= {floor_str}"
    raise VenvSetupError(
        f"Could not find {wanted} for {what}. Tried: "
        f"{'; '.join(tried) or 'python3.X on PATH, pyenv versions, uv python find'}. "
        f"{how_to_name}"
    )


def interpreters_available() -> list[str]:
    """Versions of the CPython interpreters on PATH, in pyenv's and uv's interpreter folders
    (each probed once; `uv python find` is not asked: it adds seconds and finds the same)."""
    seen: set[Path] = set()
    versions: list[str] = []
    for exe in _candidates(None, ask_uv=False):
        if exe.resolve() in seen:
            continue
        seen.add(exe.resolve())
        if (version := _probe_python(exe)) is not None:
            versions.append(version)
    return versions


def default_version(python: str | None = None) -> str:
    """The newest release of `RELEASES` whose declared floor an interpreter here meets
    (`python`, else $VF_NEMOGYM_PYTHON, else every interpreter `find_python_for` can see). The
    below-floor opt-in permits a release the user names; it never picks one. Falls back to
    `DEFAULT_NEMO_GYM_VERSION` when nothing fits (its own error then names the problem)."""
    python = python or os.environ.get(PYTHON_ENV_VAR) or None
    if python is not None and not _VERSION_SPEC.match(python):
        exe = Path(python).expanduser()
        found = _probe_python(Path(shutil.which(python) or exe).absolute())
        versions = [found] if found else []
    else:
        versions = [v for v in interpreters_available() if python is None or _acceptable(v, python)]
    for release in sorted(RELEASES, key=parse_version, reverse=True):
        if any(_satisfies(v, RELEASES[release].python_floor) for v in versions):
            return release
    return DEFAULT_NEMO_GYM_VERSION


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
    below_floor: bool = False
    """True when `python` is below the release's declared floor (built with the opt-in: uv
    installs as for the floor version, here and in NeMo Gym's per-server installs)."""
    python_floor: str = ""
    """The release's declared floor, e.g. "3.13.14" (from its metadata)."""

    @property
    def info(self) -> dict[str, object]:
        """What traces record as `trace.info["nemo_gym_runtime"]`."""
        return {
            "nemo_gym": self.nemo_gym_version,
            "python": self.python_version,
            "below_floor": self.below_floor,
        }

    @property
    def uv_config(self) -> Path:
        """A uv.toml pinning uv's `python-version` to the floor (written for below-floor
        runtimes; exported as UV_CONFIG_FILE so NeMo Gym's own `uv pip install`s accept it)."""
        return self.venv / "vf-nemogym-uv.toml"

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
            / _runtime_name(self.nemo_gym_version, self.python_version, self.below_floor)
        )

    def server_venvs_for(self, packages: Sequence[str]) -> Path:
        """`server_venvs_dir`, or for a stack whose sandbox servers get `packages` (absolute
        local paths or requirements, `containers.sandbox.check_sandbox_packages`) a folder of
        its own beside it, named by `packages_digest`: NeMo Gym puts a server's venv at
        `<uv_venv_dir>/<type>/<name>/.venv` whatever its requirements say, so a plug-in's
        package (and what it pulls in) would otherwise land in the venvs every other stack
        uses, and a changed package would meet a venv NeMo Gym skips as present."""
        base = self.server_venvs_dir
        if not packages:
            return base
        return base.with_name(f"{base.name}+sandbox-{packages_digest(packages)}")

    def env(self, ray_tmpdir: Path | None = None) -> dict[str, str]:
        """The process environment for NeMo Gym subprocesses.

        `ray_tmpdir` should be private to one stack and short: Ray puts unix sockets below it and
        those paths are limited to ~107 characters.
        """
        env = clean_env()
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
        # A token of the user's own (or one in ~/.ray) must not be what a stack's Ray accepts:
        # `private_ray_auth` gives each stack its own.
        for key in _RAY_AUTH_VARS:
            env.pop(key, None)
        env["RAY_TMPDIR"] = str(ray_tmpdir or Path("/tmp") / f"vfng-{os.getuid()}")
        # Datasets come from files; a stray hub lookup would only add latency or hang offline.
        env["HF_HUB_OFFLINE"] = "1"
        env["WANDB_MODE"] = "disabled"
        env["PYTHONUNBUFFERED"] = "1"
        # Every server process imports thousands of modules from the runtime and server venvs,
        # which are ours (the cache). A user's PYTHONDONTWRITEBYTECODE (common in container
        # images) would have every stack start compile them all again: a warm start of
        # example_single_tool_call took 41 CPU-s so, 24 with its bytecode written once.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        if self.below_floor:
            # The explicit opt-in: NeMo Gym's per-server `uv pip install nemo-gym==<v>` would
            # refuse this interpreter; uv reads `[pip] python-version` from this file instead.
            env["UV_CONFIG_FILE"] = str(self.uv_config)
        return env


def packages_digest(lines: Sequence[str]) -> str:
    """16 hex digits naming `lines` (as `check_sandbox_packages` returns them) and what the
    local ones hold (a file's bytes; a folder's files' names, sizes and modification times,
    its hidden folders, `__pycache__` and `build` skipped), so a rebuilt wheel at the same path
    names a new set of server venvs."""
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode() + b"\0")
        path = Path(line)
        if path.is_absolute() and path.is_file():
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        elif path.is_absolute() and path.is_dir():
            for folder, dirs, files in os.walk(path):
                dirs[:] = sorted(
                    d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "build")
                )
                for name in sorted(files):
                    info = (Path(folder) / name).stat()
                    rel = (Path(folder) / name).relative_to(path)
                    digest.update(f"{rel}\0{info.st_size}\0{info.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


class WarmStart:
    """A config set's (paths, judge API) warm stamp (a start succeeded: NeMo Gym may skip its
    server venvs) and the build lock serialising its cold starts across processes."""

    def __init__(self, server_venvs: Path, config_paths: list[Path], judge_api: str | None):
        judge = [f"judge:{judge_api}"] if judge_api is not None else []
        key = json.dumps(sorted(map(str, config_paths)) + judge).encode()
        self.stamp = server_venvs / ".warm" / hashlib.sha256(key).hexdigest()[:16]
        self._config_paths = config_paths
        self._lock_path = server_venvs / ".build.lock"
        self._lock: IO[str] | None = None

    async def lock_if_cold(self, deadline: float, log: logging.Logger = logger) -> None:
        """Serialise cold starts: a second stack would use server venvs still being built."""
        if self.stamp.exists():
            return
        waiting = "waiting for another stack to build NeMo Gym server venvs"
        try:
            self._lock = await acquire_flock(
                self._lock_path, deadline, poll=0.5, on_wait=lambda: log.info(waiting)
            )
        except TimeoutError:
            raise StackError(f"timed out waiting for {self._lock_path}") from None
        if self.stamp.exists():  # built by the stack we waited for
            self.release()

    def mark_warm(self) -> None:
        self.stamp.parent.mkdir(parents=True, exist_ok=True)
        self.stamp.write_text("\n".join(map(str, self._config_paths)) + "\n")
        self.release()

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the fd drops the flock
            self._lock = None


_RAY_AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
WORKDIR_PREFIX = "vf-nemogym-stack-"
RAY_TMPDIR_PREFIX = "vfng-"
"""A stack's private temp folder in /tmp (Ray's sockets and sessions, the stack's Ray token, its
processes' `$TMPDIR`): short, for Ray's unix socket paths."""
# Held (flock) by the stack that created the workdir (or the Ray temp folder) from its creation
# to its stop.
WORKDIR_LOCK = ".in-use"
STALE_WORKDIR_SECONDS = 24 * 3600.0


def prune_stale_workdirs(
    parent: Path,
    older_than: float = STALE_WORKDIR_SECONDS,
    log: logging.Logger = logger,
    prefix: str = WORKDIR_PREFIX,
) -> list[Path]:
    """Delete this user's `prefix` folders (not links) in `parent` untouched (folder and
    `ng_run.log`) for `older_than` s, that no process runs in and whose `WORKDIR_LOCK` no stack
    holds (docs/runtime.md); returns those deleted, never raises. A Ray temp folder
    (`RAY_TMPDIR_PREFIX`) is deleted only if it has that lock file: a folder of the prefix
    without one is another tool's, or an older release's stack's that may still run."""
    removed: list[Path] = []
    in_use: set[Path] | None = None
    now = time.time()
    try:
        candidates = sorted(parent.glob(f"{prefix}*"))
    except OSError:
        return removed
    for path in candidates:
        try:
            info = path.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            if prefix == RAY_TMPDIR_PREFIX and not (path / WORKDIR_LOCK).is_file():
                continue
            log_file = path / "ng_run.log"
            touched = max(info.st_mtime, log_file.stat().st_mtime if log_file.exists() else 0)
            if now - touched < older_than:
                continue
            if in_use is None:
                in_use = {cwd for pid in pids() if (cwd := cwd_of(pid)) is not None}
            real = path.resolve()  # /proc names cwds by their real path
            if any(cwd == real or real in cwd.parents for cwd in in_use):
                continue
            handle = try_flock(path / WORKDIR_LOCK)
        except OSError:
            continue
        if handle is None:
            continue  # a stack is using it
        try:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            handle.close()
        log.info("removed a stale NeMo Gym stack folder: %s", path)
        removed.append(path)
    return removed


_TMP_BUILD = re.compile(r"\.tmp-(nemo-gym-.+)-[0-9a-f]{8}")


def prune_interrupted_builds(root: Path) -> list[Path]:
    """Delete the temporary folders (`.tmp-<runtime>-<hex>`) that runtime builds killed
    before their cleanup (SIGKILL) left in `root`; returns those deleted, never raises.

    A build makes and removes its folder while holding `.<runtime>.lock`, so a folder whose
    lock can be taken here belongs to no live build."""
    removed: list[Path] = []
    try:
        candidates = sorted(root.glob(".tmp-nemo-gym-*"))
    except OSError:
        return removed
    for path in candidates:
        if not (match := _TMP_BUILD.fullmatch(path.name)) or path.is_symlink():
            continue
        try:
            handle = try_flock(root / f".{match.group(1)}.lock")
        except OSError:
            continue
        if handle is None:
            continue  # being built right now
        try:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            handle.close()
        removed.append(path)
    return removed


def _runtime_name(nemo_gym_version: str, python_version: str, below_floor: bool = False) -> str:
    suffix = "-below-floor" if below_floor else ""
    return f"nemo-gym-{nemo_gym_version}-py{python_version}{suffix}"


def _load_complete(venv: Path) -> NeMoGymVenv | None:
    """The runtime at `venv` if it is complete and its interpreter still exists, else None."""
    try:
        data = json.loads((venv / _MARKER_NAME).read_text())
        runtime = NeMoGymVenv(
            venv=venv,
            python=Path(data["python"]),
            python_version=str(data["python_version"]),
            nemo_gym_version=str(data["nemo_gym_version"]),
            below_floor=bool(data.get("below_floor", False)),
            python_floor=floor_text(python_floor(str(data["nemo_gym_version"]), venv)),
        )
    except (OSError, ValueError, KeyError):
        return None
    if not (runtime.python.exists() and runtime.bin("ng_run").exists()):
        return None
    if runtime.below_floor and not runtime.uv_config.is_file():
        return None
    if (base := base_interpreter(runtime.python)) != runtime.python:
        # Recorded by an earlier release from a venv's interpreter (prime-rl, `uv run`): NeMo
        # Gym's per-server `uv venv` cannot use it. The venv itself is sound; repair the record.
        logger.warning(
            "NeMo Gym runtime %s recorded a virtual environment's interpreter (%s); using its "
            "base interpreter %s",
            venv.name,
            runtime.python,
            base,
        )
        data["python"] = str(base)
        tmp = venv / f".{_MARKER_NAME}.{uuid.uuid4().hex[:8]}"
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, venv / _MARKER_NAME)
        runtime = dataclasses.replace(runtime, python=base)
    return runtime


def _find_cached(
    root: Path, version: str, spec: str | None, allow_below_floor: bool
) -> NeMoGymVenv | None:
    """A complete cached runtime matching `spec`, found without running any interpreter. A
    below-floor runtime is a match only with the opt-in, and only if no other one matches."""
    matches: list[NeMoGymVenv] = []
    for venv in root.glob(f"nemo-gym-{version}-py3.*"):
        runtime = _load_complete(venv)
        if runtime is None or runtime.nemo_gym_version != version:
            continue
        if runtime.below_floor and not allow_below_floor:
            continue
        floor = parse_version(runtime.python_floor).release if runtime.python_floor else MIN_PYTHON
        if not runtime.below_floor and not _satisfies(runtime.python_version, floor):
            continue  # below the floor but not built with the opt-in: not ours to trust
        if spec is None:
            matches.append(runtime)
        elif _VERSION_SPEC.match(spec):
            if _acceptable(runtime.python_version, spec):
                matches.append(runtime)
        elif base_interpreter(Path(spec).expanduser()) == runtime.python:
            matches.append(runtime)
    # Prefer a runtime that meets the floor; then the oldest Python, most likely to satisfy pins.
    matches.sort(key=lambda r: (r.below_floor, parse_version(r.python_version)))
    return matches[0] if matches else None


def ensure_venv(
    version: str | None = None,
    python: str | None = None,
    *,
    allow_below_floor: bool | None = None,
    log: logging.Logger = logger,
) -> NeMoGymVenv:
    """Return the cached NeMo Gym runtime for `version`, creating it on first use.

    `version` None means `default_version(python)`. `python` is as for `find_python`.
    `allow_below_floor` (None: $VF_NEMOGYM_ALLOW_PYTHON_BELOW_FLOOR) is the explicit opt-in to
    an interpreter below the release's declared floor; without it such an interpreter is a
    one-line `VenvSetupError` saying how to opt in. A cache, `runtimes/` or `server-venvs/`
    folder that is not ours or that others can write to is a one-line ConfigError. Creation is
    atomic (built in a temporary folder, then renamed) and serialised between processes by a
    file lock. The chosen release and Python are logged (a warning when below the floor).
    """
    python = python or os.environ.get(PYTHON_ENV_VAR) or None
    allow = allow_below_floor_default() if allow_below_floor is None else allow_below_floor
    version = version or default_version(python)
    # Checked before use: a runtime or server venv someone else can write to runs their code.
    root = private_cache("runtimes")
    private_cache("server-venvs")
    prune_interrupted_builds(root)
    runtime = _find_cached(root, version, python, allow)
    if runtime is None:
        runtime = _create(root, version, python, allow, log)
    _log_choice(runtime, log)
    return runtime


def _log_choice(runtime: NeMoGymVenv, log: logging.Logger) -> None:
    if runtime.below_floor:
        log.warning(
            "NeMo Gym %s runtime on Python %s, BELOW its declared floor >= %s (opted in; uv "
            "installs as for %s): %s",
            runtime.nemo_gym_version,
            runtime.python_version,
            runtime.python_floor,
            runtime.python_floor,
            runtime.venv,
        )
    else:
        log.info(
            "NeMo Gym %s runtime on Python %s: %s",
            runtime.nemo_gym_version,
            runtime.python_version,
            runtime.venv,
        )


def _create(
    root: Path, version: str, python: str | None, allow: bool, log: logging.Logger
) -> NeMoGymVenv:
    files = release_files(version, log)  # its metadata: the exact floor, and whether Ray is extra
    floor = python_floor(version, files.root)
    exe, python_version, below = find_python_for(
        python, floor=floor, allow_below_floor=allow, what=f"NeMo Gym {version}"
    )
    name = _runtime_name(version, python_version, below)
    target = root / name
    with file_lock(root / f".{name}.lock"):
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
        env = clean_env() | {"UV_PYTHON_DOWNLOADS": "never"}
        # Below the floor (opted in): uv resolves as for the floor version, which it would
        # otherwise refuse (`Requires-Python`); nothing else changes.
        override = ["--python-version", floor_text(floor)] if below else []
        try:
            # --relocatable: scripts and activation resolve paths at run time, so the rename
            # below does not break bin/ng_run's shebang.
            run_uv(
                [str(uv), "venv", "--relocatable", "--no-project", "--python", str(exe), str(tmp)],
                env,
                f"`uv venv` with {exe}",
            )
            run_uv(
                [str(uv), "pip", "install", "--python", str(tmp / "bin" / "python"), *override,
                 files.requirement],
                env,
                f"installing {files.requirement}",
            )  # fmt: skip
            if not (tmp / "bin" / "ng_run").exists():
                raise VenvSetupError(f"nemo-gym=={version} installed no `ng_run` command")
            if below:
                (tmp / "vf-nemogym-uv.toml").write_text(
                    f'[pip]\npython-version = "{floor_text(floor)}"\n'
                )
            marker = {
                "python": str(exe),
                "python_version": python_version,
                "nemo_gym_version": version,
                "below_floor": below,
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
