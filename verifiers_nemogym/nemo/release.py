"""What a NeMo Gym release is: what it can do (`RELEASES`), its extras, and its files.

`features(version)` is the one place a difference between releases is decided (an unknown
release gets the row of the newest known one not newer than it, PEP 440 order); nothing else
compares versions. `release_files(version)` is what the `nemo-gym==<version>` wheel installs,
fetched once into `cache_root()/releases/`: enough to read environments, configs and rows
without a runtime. Nothing here imports `nemo_gym` (docs/runtime.md).
"""

from __future__ import annotations

import logging
import re
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from packaging.version import InvalidVersion, Version

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.util import clean_env, file_lock, find_uv, private_cache, run_uv

logger = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_NEMO_GYM_VERSION = "0.4.0"
"""The fallback release: the newest one whose floor (3.12) needs no recent patch release."""
# NeMo Gym >= 0.2 requires Python >= 3.12; older interpreters are never candidates.
MIN_PYTHON = (3, 12)


@dataclass(frozen=True)
class Features:
    """One release as this package treats it: a field the library acts on is on from the release
    it was verified on (tests/nemo/test_releases.py checks each row against the release's files).
    Extras are read from each release's own metadata instead (`ReleaseFiles.extras`)."""

    python_floor: tuple[int, ...]  # its `Requires-Python` (the metadata's, where installed)
    gym_cli: bool = False  # `gym env start` (`ng_run` its deprecated shim; same overrides)
    readyz: bool = False  # the head server's `/readyz` (else ng_run's ready line)
    spinup_timeout: bool = False  # `+server_spinup_timeout_seconds`, its own start deadline
    pairing_check: bool = False  # `allowed_model_types` holds (`+allow_unsupported_pairing` waives)
    environment_servers: bool = False  # front agents, take their `/run` (`catalog.run_targets`)
    rollout_correlation: bool = False  # agents call the model at `/ng-rollout/<_ng_rollout_id>/v1`
    failure_class: bool = False  # 200 results tagged `_ng_failure_class` or `_ng_no_persist`
    mask_sample: bool = False  # results `mask_sample: true` (`failure_kind`, `failure_reason`)
    environments_layout: bool = False  # `environments/<name>/` beside `resources_servers/`
    sandbox_providers: frozenset[str] = frozenset()  # `nemo_gym/sandbox/providers/<name>/`
    worker_healthcheck: bool = False  # `uvicorn_timeout_worker_healthcheck` (else 30 s, fixed)


# Each row is the one before it with what the release changed.
_0_4 = Features(
    (3, 12), environments_layout=True, sandbox_providers=frozenset({"apptainer", "opensandbox"})
)
_0_5 = replace(
    _0_4,
    python_floor=(3, 13, 14),
    failure_class=True,
    rollout_correlation=True,
    sandbox_providers=_0_4.sandbox_providers
    | {"daytona", "docker", "ecs_fargate", "enroot", "openshell"},
)
_0_6 = replace(
    _0_5,
    mask_sample=True,
    sandbox_providers=_0_5.sandbox_providers | {"e2b"},
    worker_healthcheck=True,
)
RELEASES: dict[str, Features] = {
    "0.4.0": _0_4,
    "0.5.0": _0_5,
    "0.5.1": _0_5,
    "0.6.0": _0_6,
    "0.7.0": replace(
        _0_6,
        gym_cli=True,
        readyz=True,
        spinup_timeout=True,
        pairing_check=True,
        environment_servers=True,
        sandbox_providers=_0_6.sandbox_providers | {"local"},
    ),
}
"""nemo-gym release -> what it has. The newest entry that an interpreter here satisfies is the
default release. A new release is a row here (and its tests)."""
_RELEASE = re.compile(r"^\d+(\.\d+){1,2}(\.?(a|b|rc|dev|post)\d+)?$")
_COMPLETE = ".vf-nemogym-complete"


def parse_version(version: str) -> Version:
    """A release or interpreter version as PEP 440 orders it (`0.8.0rc1 < 0.8.0 < 0.8.0.post1`,
    `0.7.1rc1 > 0.7.0`); a CPython build suffix (`3.13.0+`) is dropped. ConfigError if it does
    not read as a version."""
    try:
        return Version(version.strip().rstrip("+"))
    except InvalidVersion:
        raise ConfigError(f"{version!r} is not a version number") from None


def floor_version(floor: tuple[int, ...]) -> Version:
    """A Python floor `(3, 13, 14)` as a `Version`, to compare interpreters with."""
    return Version(floor_text(floor))


def floor_text(floor: tuple[int, ...]) -> str:
    return ".".join(map(str, floor))


def check_release(version: str) -> str:
    """`version` if it reads as a release number (it becomes part of paths), else ConfigError."""
    if not _RELEASE.match(version):
        raise ConfigError(
            f"--env.taskset.nemo-gym-version {version!r} is not a nemo-gym release number "
            "(e.g. 0.4.0)"
        )
    return version


def release_row(table: Mapping[str, T], version: str) -> tuple[str, T] | None:
    """The row of `table` (keyed by release) that serves nemo-gym `version`, with its key: its
    own, else the newest one not newer than it (PEP 440 order), else None. Every per-release
    table answers through this rule (`features`, the conformance, container and CLI tables), so
    a new release is a row where it differs and inherits the rest."""
    if version in table:
        return version, table[version]
    target = parse_version(version)
    older = [v for v in table if parse_version(v) <= target]
    if not older:
        return None
    newest = max(older, key=parse_version)
    return newest, table[newest]


def features(version: str) -> Features:
    """What nemo-gym `version` has: its `RELEASES` row by `release_row`, else (older than all)
    `Features(MIN_PYTHON)`, which has nothing new."""
    row = release_row(RELEASES, version)
    return row[1] if row is not None else Features(MIN_PYTHON)


def python_floor(version: str, venv: Path | None = None) -> tuple[int, ...]:
    """The Python floor nemo-gym `version` declares: its metadata's when `venv` (a runtime venv
    or a `release_files` folder) holds it (cheap, exact), else its `features`."""
    if venv is not None:
        for meta in _metadata_files(venv, version):
            if floor := _metadata_floor(meta):
                return floor
    return features(version).python_floor


def _metadata_files(folder: Path, version: str) -> list[Path]:
    name = f"nemo_gym-{version}.dist-info/METADATA"
    return [*folder.glob(name), *folder.glob(f"lib/python3*/site-packages/{name}")]


def _headers(meta: Path) -> list[tuple[str, str]]:
    """The header lines of a dist-info METADATA file as (lowercased key, value)."""
    found: list[tuple[str, str]] = []
    try:
        with meta.open(encoding="utf-8") as lines:
            for line in lines:
                if not line.strip():
                    break  # the headers end at the first blank line
                key, _, value = line.partition(":")
                found.append((key.strip().lower(), value.strip()))
    except OSError:
        return []
    return found


def _metadata_floor(meta: Path) -> tuple[int, ...] | None:
    """`Requires-Python: >=X.Y[.Z]` of a dist-info METADATA file, as a tuple."""
    for key, value in _headers(meta):
        if key == "requires-python":
            found = re.search(r">=\s*(3\.\d+(?:\.\d+)?)", value)
            return parse_version(found.group(1)).release if found else None
    return None


@dataclass(frozen=True)
class ReleaseFiles:
    """The files of one nemo-gym release (no interpreter, no dependencies)."""

    root: Path
    """Holds the wheel's top-level folders, as a runtime's site-packages does."""
    version: str

    @property
    def extras(self) -> frozenset[str]:
        """The extras the release declares (`Provides-Extra`), e.g. `ray` after NeMo Gym 0.7."""
        return frozenset(
            value
            for meta in _metadata_files(self.root, self.version)
            for key, value in _headers(meta)
            if key == "provides-extra"
        )

    @property
    def requirement(self) -> str:
        """What a runtime installs: `nemo-gym[ray]==<v>` where Ray is an extra (servers that
        declare `ray_enabled` need it), else `nemo-gym==<v>`."""
        extra = "[ray]" if "ray" in self.extras else ""
        return f"nemo-gym{extra}=={self.version}"


def release_files(version: str, log: logging.Logger = logger) -> ReleaseFiles:
    """A folder holding exactly what the `nemo-gym==<version>` wheel installs (its server and
    environment trees with configs and example data, and its dist-info), fetched once with
    `uv pip install --no-deps --target` (built beside, then renamed; serialised between
    processes) and afterwards returned without starting any process."""
    check_release(version)
    # Checked before use: configs planted by another user would run in NeMo Gym as you.
    root = private_cache("releases")
    target = root / f"nemo-gym-{version}"
    if (target / _COMPLETE).is_file():
        return ReleaseFiles(target, version)
    with file_lock(root / f".nemo-gym-{version}.lock"):
        if (target / _COMPLETE).is_file():  # fetched by another process while we waited
            return ReleaseFiles(target, version)
        if target.exists():
            shutil.rmtree(target)  # left by an interrupted older layout: not ours to trust
        uv = find_uv()
        assert uv is not None
        began = time.monotonic()
        tmp = root / f".tmp-nemo-gym-{version}-{uuid.uuid4().hex[:8]}"
        try:
            # No dependencies and no interpreter of the release's: only its files. uv checks the
            # release's Requires-Python against the version we claim, so claim its floor.
            run_uv(
                [str(uv), "pip", "install", "--quiet", "--no-deps", "--target", str(tmp),
                 "--python-version", floor_text(python_floor(version)), f"nemo-gym=={version}"],
                clean_env() | {"UV_PYTHON_DOWNLOADS": "never"},
                f"fetching the files of nemo-gym=={version}",
            )  # fmt: skip
            (tmp / _COMPLETE).write_text(f"{version}\n")
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log.info("fetched nemo-gym %s's files in %.1f s", version, time.monotonic() - began)
    return ReleaseFiles(target, version)
