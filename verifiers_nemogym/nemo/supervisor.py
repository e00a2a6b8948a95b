"""Keeps one `ng_run` process tree from outliving the Python process that started it.

A program of its own, stdlib only (run by file path with `python -I`, never importing the package):

    python supervisor.py --marker ID --log FILE --cwd DIR [--remove-if-orphaned DIR]
        [--docker-label KEY=VALUE] [--sandbox-stop MODULE] -- ng_run ...

It runs the command in its own session with `VF_NEMOGYM_STACK=ID`, appends its output to FILE,
and tears the tree down when its stdin closes, on SIGTERM/SIGINT, when re-parented or when the
command exits; exit status: the command's, or 0 if the teardown stopped it. The teardown, and why
the package's /proc readers live here: docs/architecture.md, "Processes".
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

MARKER_ENV_VAR = "VF_NEMOGYM_STACK"
# NeMo Gym's own shutdown (SIGINT to servers, 1 s grace, SIGKILL) takes ~5 s.
GRACEFUL_SECONDS = 10.0
TERM_SECONDS = 3.0
KILL_SECONDS = 5.0
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1


def processes_with_marker(marker: str) -> list[int]:
    """PIDs of live processes whose initial environment has VF_NEMOGYM_STACK=<marker>."""
    return processes_with_env(f"{MARKER_ENV_VAR}={marker}")


def processes_with_env(entry: str) -> list[int]:
    """PIDs of live processes whose initial environment holds `entry` (`NAME=value`) exactly.

    Zombies have an empty environ and are not reported (they hold no resources but a PID).
    """
    needle = entry.encode()
    return [pid for pid in pids() if needle in environ_of(pid)]


def signal_with_env(pids: list[int], entry: str, sig: int) -> list[int]:
    """Send `sig` to those of `pids` (from a scan such as `processes_with_env(entry)`) that
    still hold `entry` in their initial environment; returns the PIDs signalled.

    Each process is pinned by a pidfd first and checked after: a PID that was reused since the
    scan names a process without `entry`, which is left alone."""
    return _signal_checked(pids, sig, lambda pid: entry.encode() in environ_of(pid))


def _signal_checked(pids: list[int], sig: int, still_ours: Callable[[int], bool]) -> list[int]:
    """Send `sig` by pidfd to each of `pids` for which `still_ours(pid)` holds once the pidfd is
    open (so the check is about the very process signalled); returns the PIDs signalled."""
    signalled: list[int] = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone (or not ours)
            continue
        try:
            if still_ours(pid):
                signal.pidfd_send_signal(fd, sig)
                signalled.append(pid)
        except OSError:  # exited meanwhile, or not ours to signal
            pass
        finally:
            os.close(fd)
    return signalled


def processes_mentioning(token: str) -> list[int]:
    """PIDs of live processes whose initial environment mentions `token` in any value, or names
    a `CODEX_HOME` whose `config.toml` does (codex reads its base URL only from there): the
    processes of one rollout of a coding-agent CLI, whose only per-rollout value is the rollout
    id in its model URL, and their children, which inherit that environment."""
    needle = token.encode()
    return [pid for pid in pids() if _mentions(pid, needle)]


def _mentions(pid: int, needle: bytes) -> bool:
    environ = environ_of(pid)
    if any(needle in entry for entry in environ):
        return True
    for entry in environ:
        if entry.startswith(b"CODEX_HOME="):
            with contextlib.suppress(OSError):
                return needle in Path(os.fsdecode(entry[11:]), "config.toml").read_bytes()
    return False


def kill_processes_mentioning(token: str) -> list[int]:
    """SIGKILL every process `processes_mentioning(token)` finds (each re-checked through a
    pidfd, so a reused PID is spared); returns the PIDs killed."""
    needle = token.encode()
    return _signal_checked(
        processes_mentioning(token), signal.SIGKILL, lambda pid: _mentions(pid, needle)
    )


_CONTAINER_ID = re.compile(r"docker[-/]([0-9a-f]{64})")


def container_of(pid: int) -> str | None:
    """The full id of the docker container `pid` runs in (its cgroup path names it, cgroup v1
    `/docker/<id>` or v2 `docker-<id>.scope`); None if none, or if it is gone."""
    try:
        with open(f"/proc/{pid}/cgroup") as handle:
            found = _CONTAINER_ID.search(handle.read())
    except OSError:
        return None
    return found.group(1) if found else None


def pids() -> list[int]:
    """The PIDs /proc lists now."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def environ_of(pid: int) -> list[bytes]:
    """`pid`'s initial environment entries (`NAME=value`); empty if it is gone, a zombie, or
    not ours to read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return handle.read().split(b"\0")
    except OSError:
        return []


def env_value(pid: int, name: str) -> str | None:
    """The value of `name` in `pid`'s initial environment, None if it has none."""
    prefix = f"{name}=".encode()
    for entry in environ_of(pid):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")
    return None


def cwd_of(pid: int) -> Path | None:
    """`pid`'s working folder (its real path); None if it is gone or not ours to inspect."""
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


def uid_of(pid: int) -> int | None:
    """The uid owning `pid`; None if it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _stat(pid: int) -> list[str] | None:
    """`pid`'s /proc/PID/stat fields from the third (its state) on; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            # The command name (field 2) may hold spaces and parentheses: split after the last.
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _state_and_parent(pid: int) -> tuple[str, int] | None:
    """`pid`'s state letter (`Z`: a zombie) and parent PID; None if it is gone."""
    fields = _stat(pid)
    return (fields[0], int(fields[1])) if fields and fields[1:2] and fields[1].isdigit() else None


def _start_of(fields: list[str]) -> int | None:
    """The start time in `_stat`'s fields (stat field 22, the 20th from the state)."""
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def started(pid: int) -> int | None:
    """When `pid` started, in clock ticks after boot (stat field 22); None if it is gone. With
    the PID it names one process of a boot: a process given a reused PID started later."""
    fields = _stat(pid)
    return _start_of(fields) if fields else None


def alive(pid: int, started_at: int | None = None) -> bool:
    """Whether `pid` is a live process (a zombie is not) of this machine; with `started_at`
    (`started`), only the process that started then, never a later one given the same PID."""
    fields = _stat(pid)
    if not fields or fields[0] == "Z":
        return False
    return started_at is None or _start_of(fields) == started_at


def rss_bytes(pid: int) -> int:
    """Resident memory of `pid` in bytes, 0 if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def descendants(root: int) -> dict[int, int]:
    """Live (not zombie) descendants of `root`, each PID with its parent's PID."""
    children: dict[int, list[tuple[int, str]]] = {}
    for pid in pids():
        if (stat := _state_and_parent(pid)) is not None:
            children.setdefault(stat[1], []).append((pid, stat[0]))
    found: dict[int, int] = {}
    todo = [root]
    while todo:
        parent = todo.pop()
        for pid, state in children.get(parent, []):
            if pid not in found:
                if state != "Z":
                    found[pid] = parent
                todo.append(pid)
    return found


def argv_of(pid: int) -> list[str]:
    """`pid`'s command line; empty if it is gone, a zombie or a kernel thread."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [a.decode(errors="replace") for a in handle.read().split(b"\0") if a]
    except OSError:
        return []


def parent_of(pid: int) -> int:
    """`pid`'s parent PID; 0 if it is gone."""
    return found[1] if (found := _state_and_parent(pid)) is not None else 0


class _Supervisor:
    def __init__(self, marker: str, log_path: Path, cwd: Path, command: list[str]) -> None:
        self.marker = marker
        self.log_path = log_path
        self.cwd = cwd
        self.command = command
        self.owner = os.getppid()
        self.stop_requested = False
        self.child: subprocess.Popen[bytes] | None = None
        self.child_pid: int | None = None
        self.child_status: int | None = None

    def note(self, message: str) -> None:
        with self.log_path.open("a") as handle:
            handle.write(f"[vf-nemogym supervisor] {message}\n")

    def start(self) -> None:
        env = dict(os.environ)
        env[MARKER_ENV_VAR] = self.marker
        with self.log_path.open("ab") as log:
            proc = subprocess.Popen(
                self.command,
                cwd=self.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Own session: signals we send to the group reach ng_run and its servers only.
                start_new_session=True,
                preexec_fn=die_with_parent(os.getpid()),
            )
        # From here on children are reaped by `reap()` (we are a subreaper), not by Popen. The
        # Popen is kept: a dropped one polls its child on deletion, and would reap (and hide
        # from `reap()`) a command that exited at once.
        self.child = proc
        self.child_pid = proc.pid
        self.note(f"started pid {proc.pid}: {' '.join(self.command[:1])}")

    def reap(self) -> None:
        """Collect every exited child: ng_run and orphans re-parented to us."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.child_pid:
                self.child_status = os.waitstatus_to_exitcode(status)

    def should_stop(self) -> str | None:
        if self.stop_requested:
            return "stop requested"
        if os.getppid() != self.owner:
            # The owner died but a forked copy of our stdin pipe kept EOF from arriving.
            return "owner process is gone"
        if self.child_status is not None:
            return f"ng_run exited with status {self.child_status}"
        return None

    def wait(self) -> str:
        stdin_fd = sys.stdin.fileno()
        while True:
            self.reap()
            if (reason := self.should_stop()) is not None:
                return reason
            readable, _, _ = select.select([stdin_fd], [], [], 0.5)
            if readable and not os.read(stdin_fd, 4096):
                return "owner closed the control pipe"

    def teardown(self) -> None:
        pid = self.child_pid
        if pid is not None and self.child_status is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGINT)
            deadline = time.monotonic() + GRACEFUL_SECONDS
            while self.child_status is None and time.monotonic() < deadline:
                time.sleep(0.1)
                self.reap()
        self._signal_all(signal.SIGTERM, TERM_SECONDS)
        left = self._signal_all(signal.SIGKILL, KILL_SECONDS)
        if left:
            self.note(f"processes survived SIGKILL: {left}")

    def _signal_all(self, sig: signal.Signals, seconds: float) -> list[int]:
        """Send `sig` to the group, every marker process and every descendant until none is
        left or time is up.

        Repeated because a dying Ray raylet or a shell may still spawn a process meanwhile.
        """
        # While ng_run is unreaped its PID (the group's id) cannot be reused; after, the group's
        # members are found as marker processes or descendants.
        if self.child_pid is not None and self.child_status is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child_pid, sig)
        entry = f"{MARKER_ENV_VAR}={self.marker}"
        me = os.getpid()
        deadline = time.monotonic() + seconds
        while True:
            self.reap()
            marked = [p for p in processes_with_env(entry) if p != me]
            # A descendant that cleared its environment (and left the session) is still ours.
            tree = descendants(me)
            alive = sorted(set(marked) | set(tree))
            if not alive or time.monotonic() >= deadline:
                return alive
            signal_with_env(marked, entry, sig)
            _signal_checked([p for p in tree if p not in marked], sig, _still_below(tree, me))
            time.sleep(0.2)


def _still_below(tree: dict[int, int], me: int) -> Callable[[int], bool]:
    """Whether a PID of `tree` (`descendants(me)`) is still that process: its parent is the one
    scanned, or us if that parent died since (we are a subreaper)."""
    return lambda pid: parent_of(pid) in (tree[pid], me)


def die_with_parent(parent: int, sig: int = signal.SIGINT) -> Callable[[], None]:
    """A `preexec_fn` giving the child `sig` when `parent` (the process calling Popen, whose
    PID it is) dies, however it dies (SIGKILL included); also at once if it died before.

    The kernel ties the signal to the thread that forked: the thread calling Popen must live as
    long as the parent (the main thread, or an event loop's). The supervisor's default is
    SIGINT, not SIGKILL: it is what its teardown sends first, and ng_run answers it by shutting
    its servers down; SIGKILL would leave them running, orphaned. Other owners pass SIGTERM (a
    child started from a background shell ignores SIGINT). Best effort (Linux only)."""

    def preexec() -> None:
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # died before the prctl took effect
            os.kill(os.getpid(), sig)

    return preexec


def _become_subreaper() -> None:
    """Orphans of the tree get re-parented to us (Linux), so we can reap them. Best effort."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


DOCKER_SECONDS = 60.0
"""Seconds one docker or iptables command of `remove_docker_objects` may take."""
SANDBOX_STOP_SECONDS = 120.0
"""Seconds `stop_sandboxes` may take (a remote provider's list and deletes)."""


def stop_sandboxes(module: str, marker: str, cwd: Path) -> str | None:
    """Run `python -I -m module --stop marker` in `cwd`: a sandbox provider's removal of the
    stack's sandboxes through its own API (the stack's servers are gone by then, so none is made
    after it). None if it succeeded, else one line saying why not."""
    argv = [sys.executable, "-I", "-m", module, "--stop", marker]
    try:
        out = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, timeout=SANDBOX_STOP_SECONDS,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{module}: {exc}"
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines() or [f"exit {out.returncode}"]
        return f"{module}: {lines[-1][:300]}"
    return None


def remove_docker_objects(label: str) -> list[str]:
    """Remove the containers (forced), then the networks, carrying the docker label `label`
    (`key=value`), then the iptables INPUT rules whose comment is `label`. Returns what could
    not be removed, one line each (empty: all gone, or no docker/iptables here)."""
    failed: list[str] = []
    docker = shutil.which("docker")
    if docker is not None:
        for kind, listing in (("container", ["ps", "-aq"]), ("network", ["network", "ls", "-q"])):
            ids = _run_lines([docker, *listing, "--filter", f"label={label}"], failed)
            if ids:
                remove = ["rm", "-f"] if kind == "container" else ["network", "rm"]
                _run_lines([docker, *remove, *ids], failed)
    iptables = shutil.which("iptables")
    if iptables is not None and os.geteuid() == 0:
        for rule in _run_lines([iptables, "-S", "INPUT"], failed):
            args = shlex.split(rule)  # a comment may be printed quoted
            if args[:2] == ["-A", "INPUT"] and _commented(args, label):
                _run_lines([iptables, "-D", *args[1:]], failed)
    return failed


def _commented(args: list[str], label: str) -> bool:
    """Whether the rule `args` (`iptables -S` split) carries the comment `label`."""
    return any(a == "--comment" and b == label for a, b in itertools.pairwise(args))


def _run_lines(argv: list[str], failed: list[str]) -> list[str]:
    """`argv`'s stdout lines; a failure (exit status, timeout) appends one line to `failed`."""
    try:
        out = subprocess.run(
            argv, capture_output=True, text=True, timeout=DOCKER_SECONDS, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        failed.append(f"{' '.join(argv[:3])}: {exc}")
        return []
    if out.returncode != 0:
        failed.append(f"{' '.join(argv[:3])}: {out.stderr.strip()[:200]}")
        return []
    return [line for line in out.stdout.splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--marker", required=True)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--cwd", required=True, type=Path)
    parser.add_argument(
        "--remove-if-orphaned",
        action="append",
        default=[],
        type=Path,
        help="a folder to delete after teardown if the owner died (it would clean it up itself)",
    )
    parser.add_argument(
        "--docker-label",
        default=None,
        help="after teardown, remove docker containers/networks and iptables rules with it",
    )
    parser.add_argument(
        "--sandbox-stop",
        default=None,
        help="after teardown, `python -I -m` this module with `--stop MARKER` (in --cwd)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")

    supervisor = _Supervisor(args.marker, args.log, args.cwd, command)

    def request_stop(signum: int, _frame: object) -> None:
        supervisor.stop_requested = True

    # Handlers (not SIG_IGN) so that the command starts with default dispositions even when our
    # owner was started with SIGINT ignored (background shells): exec resets handled signals.
    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGHUP, request_stop)
    _become_subreaper()
    try:
        supervisor.start()
    except OSError as exc:
        supervisor.note(f"cannot start {command[0]}: {exc}")
        return 127
    reason = supervisor.wait()
    supervisor.note(f"tearing down: {reason}")
    stopped_by_us = supervisor.child_status is None
    supervisor.teardown()
    if args.sandbox_stop is not None:
        failed = stop_sandboxes(args.sandbox_stop, args.marker, args.cwd)
        supervisor.note(f"could not remove the stack's sandboxes: {failed}" if failed else
                        "removed the stack's sandboxes")  # fmt: skip
    if args.docker_label is not None:
        for line in remove_docker_objects(args.docker_label):
            supervisor.note(f"could not remove a container object: {line}")
    supervisor.note("teardown complete")
    if os.getppid() != supervisor.owner:
        for folder in args.remove_if_orphaned:
            shutil.rmtree(folder, ignore_errors=True)
    if stopped_by_us:
        return 0
    return supervisor.child_status or 0


if __name__ == "__main__":
    sys.exit(main())
