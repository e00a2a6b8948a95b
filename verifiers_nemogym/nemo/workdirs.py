"""What a stack keeps on disk beyond its processes: its working folder, and which config sets
have started once.

Contract: a stack that makes its own working folder (`WORKDIR_PREFIX` in the temp dir) holds
`WORKDIR_LOCK` in it (flock) from creating it to its stop; `prune_stale_workdirs` deletes only
folders no stack holds, no process runs in, and untouched for a day. `WarmStart` is one config
set's warm stamp (a start of the set succeeded: NeMo Gym may skip its per-server venvs) and the
build lock that serialises the set's cold starts between processes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
import time
from pathlib import Path
from typing import IO

from verifiers_nemogym.errors import StackError
from verifiers_nemogym.nemo.supervisor import cwd_of, pids
from verifiers_nemogym.util import acquire_flock, try_flock

logger = logging.getLogger(__name__)

WORKDIR_PREFIX = "vf-nemogym-stack-"
WORKDIR_LOCK = ".in-use"
STALE_WORKDIR_SECONDS = 24 * 3600.0


def prune_stale_workdirs(
    parent: Path, older_than: float = STALE_WORKDIR_SECONDS, log: logging.Logger = logger
) -> list[Path]:
    """Delete the `vf-nemogym-stack-*` folders directly in `parent` (workdirs of stacks that
    created their own: kept after a failed start for their log, or left by an owner killed
    together with its supervisor) that are this user's real folders (not links), whose folder
    and `ng_run.log` are both older than `older_than` seconds, that no process runs in (a
    stack's supervisor and ng_run do, also those of releases without the lock), and whose lock
    no stack holds (a stack holds it from creating its workdir to its stop). Returns the folders
    deleted; never raises (what cannot be inspected is left alone)."""
    removed: list[Path] = []
    in_use: set[Path] | None = None
    now = time.time()
    try:
        candidates = sorted(parent.glob(f"{WORKDIR_PREFIX}*"))
    except OSError:
        return removed
    for path in candidates:
        try:
            info = path.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
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


class WarmStart:
    """One config set's warm stamp and build lock (module contract). The set is its config paths
    and its judge's API (`judge_api`: a judge adds a model server, its adapter's venv)."""

    def __init__(self, server_venvs: Path, config_paths: list[Path], judge_api: str | None):
        judge = [f"judge:{judge_api}"] if judge_api is not None else []
        key = json.dumps(sorted(map(str, config_paths)) + judge).encode()
        self.stamp = server_venvs / ".warm" / hashlib.sha256(key).hexdigest()[:16]
        """Exists once a start of the set succeeded."""
        self._config_paths = config_paths
        self._lock_path = server_venvs / ".build.lock"
        self._lock: IO[str] | None = None

    async def lock_if_cold(self, deadline: float, log: logging.Logger = logger) -> None:
        """Serialise the first start of a config set: with `skip_venv_if_present`, a second
        stack would otherwise use a per-server venv another stack is still installing."""
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
        """Stamp the set warm (its start succeeded) and release the build lock."""
        self.stamp.parent.mkdir(parents=True, exist_ok=True)
        self.stamp.write_text("\n".join(map(str, self._config_paths)) + "\n")
        self.release()

    def release(self) -> None:
        """Release the build lock, if held; idempotent."""
        if self._lock is not None:
            self._lock.close()  # closing the fd drops the flock
            self._lock = None
