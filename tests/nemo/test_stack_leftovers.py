"""What a stack leaves behind and reads back, without starting one: stale workdirs of failed
starts and runtime builds killed mid-way are pruned (only those no live stack or build holds),
and the death and stop paths read a bounded tail of an unbounded `ng_run.log`."""

from __future__ import annotations

import os
import subprocess
import time
import tracemalloc
from pathlib import Path

from verifiers_nemogym.nemo.ng_log import NgRunLog
from verifiers_nemogym.nemo.venv import (
    RAY_TMPDIR_PREFIX,
    STALE_WORKDIR_SECONDS,
    WORKDIR_LOCK,
    WORKDIR_PREFIX,
    prune_interrupted_builds,
    prune_stale_workdirs,
)
from verifiers_nemogym.util import try_flock

DAY_AGO = time.time() - STALE_WORKDIR_SECONDS - 60


def _folder(path: Path, *, age: float | None = DAY_AGO, log: bool = True) -> Path:
    path.mkdir()
    if log:
        (path / "ng_run.log").write_text("ng_run output\n")
        if age is not None:
            os.utime(path / "ng_run.log", (age, age))
    if age is not None:
        os.utime(path, (age, age))
    return path


def test_prune_stale_workdirs_removes_only_old_unused_own_folders(tmp_path: Path) -> None:
    old = _folder(tmp_path / f"{WORKDIR_PREFIX}old")
    no_log = _folder(tmp_path / f"{WORKDIR_PREFIX}nolog", log=False)
    fresh = _folder(tmp_path / f"{WORKDIR_PREFIX}fresh", age=None)
    in_use = _folder(tmp_path / f"{WORKDIR_PREFIX}inuse")
    recent_log = _folder(tmp_path / f"{WORKDIR_PREFIX}recentlog")
    os.utime(recent_log / "ng_run.log")  # the stack still writes to it
    running = _folder(tmp_path / f"{WORKDIR_PREFIX}running")  # a stack of an older release
    (running / "responses_api_models").mkdir()
    os.utime(running, (DAY_AGO, DAY_AGO))
    other = _folder(tmp_path / "something-else")
    target = _folder(tmp_path / "elsewhere")
    link = tmp_path / f"{WORKDIR_PREFIX}link"
    link.symlink_to(target)
    lock = try_flock(in_use / WORKDIR_LOCK)  # what a running stack holds
    assert lock is not None
    sleeper = subprocess.Popen(["sleep", "60"], cwd=running / "responses_api_models")
    try:
        removed = prune_stale_workdirs(tmp_path)
    finally:
        lock.close()
        sleeper.kill()
        sleeper.wait()
    assert sorted(removed) == sorted([old, no_log])
    assert not old.exists() and not no_log.exists()
    for kept in (fresh, in_use, recent_log, running, other, target, link):
        assert kept.exists(), kept


def test_prune_of_ray_temp_folders_takes_only_dead_stacks_locked_ones(tmp_path: Path) -> None:
    """A stack killed whole (owner and supervisor at once) leaves its Ray temp folder, lock file
    in it: a day later the next start deletes it; one a live stack holds, one without the lock
    file (another tool's `vfng-` folder, an older release's stack) and a fresh one stay."""
    dead = _folder(tmp_path / f"{RAY_TMPDIR_PREFIX}dead", log=False)
    (dead / WORKDIR_LOCK).touch()
    (dead / "auth_token").write_text("token")
    os.utime(dead, (DAY_AGO, DAY_AGO))
    held = _folder(tmp_path / f"{RAY_TMPDIR_PREFIX}held", log=False)
    lock = try_flock(held / WORKDIR_LOCK)
    assert lock is not None
    os.utime(held, (DAY_AGO, DAY_AGO))
    foreign = _folder(tmp_path / f"{RAY_TMPDIR_PREFIX}foreign", log=False)
    fresh = _folder(tmp_path / f"{RAY_TMPDIR_PREFIX}fresh", age=None, log=False)
    (fresh / WORKDIR_LOCK).touch()
    workdir = _folder(tmp_path / f"{WORKDIR_PREFIX}old")  # not this prefix's
    try:
        removed = prune_stale_workdirs(tmp_path, prefix=RAY_TMPDIR_PREFIX)
    finally:
        lock.close()
    assert removed == [dead] and not dead.exists()
    assert held.exists() and foreign.exists() and fresh.exists() and workdir.exists()


def test_prune_interrupted_builds_spares_a_live_build(tmp_path: Path) -> None:
    dead = _folder(tmp_path / ".tmp-nemo-gym-0.4.0-py3.12.1-0123abcd")
    (dead / "bin").mkdir()
    live = _folder(tmp_path / ".tmp-nemo-gym-0.7.0-py3.13.0-below-floor-89abcdef")
    runtime = _folder(tmp_path / "nemo-gym-0.4.0-py3.12.1")
    lock = try_flock(tmp_path / ".nemo-gym-0.7.0-py3.13.0-below-floor.lock")  # its builder's
    assert lock is not None
    try:
        assert prune_interrupted_builds(tmp_path) == [dead]
    finally:
        lock.close()
    assert not dead.exists() and live.exists() and runtime.exists()


def test_death_message_reads_a_bounded_tail_of_a_huge_log(tmp_path: Path) -> None:
    """A 64 MB log (a long training run's): the death report still names the server that died
    and quotes its last lines, and reading it costs a bounded amount of memory."""
    ng_log = NgRunLog(tmp_path / "ng_run.log")
    assert ng_log.path is not None
    with ng_log.path.open("w") as log:
        log.write("All 3 / 3 servers ready\n")
        chunk = "".join(f"(my_agent) request {i} answered\n" for i in range(1000))
        for _ in range(64 * 1024 * 1024 // len(chunk)):
            log.write(chunk)
        log.write("(my_agent) MemoryError: the last words\n")
        log.write("Process `my_agent` finished unexpectedly\n")
    assert ng_log.path.stat().st_size > 60 * 1024 * 1024
    tracemalloc.start()
    try:
        message = ng_log.death_message(1)
        assert ng_log.saw_ready_line()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "'my_agent' died" in message and "the last words" in message
    assert peak < 16 * 1024 * 1024, f"reading the log took {peak / 2**20:.0f} MB"
