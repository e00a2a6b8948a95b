"""ng_run's log, read for what a stack's owner must tell: whether NeMo Gym found every server
ready, which server died first and how, and bounded tails for error messages.

Contract: `NgRunLog(path)` reads the stack log (`path` None: before the stack has a workdir,
every read is empty); nothing here writes, and every read is bounded (`_LOG_TAIL_BYTES` from
the end; the ready line is scanned incrementally), however long the run's log grows.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

# `RunHelper.wait_for_spinup` prints this once every server answered its `GET /`. Signalling
# ng_run before this line makes it exit without running its own shutdown.
_READY_LINE = re.compile(r"All (\d+) / (\d+) servers ready")
_DIED_LINE = re.compile(r"Process `([^`]+)` finished unexpectedly")
# uvicorn logs this in `Server.shutdown` before it closes its listening socket, and NeMo Gym's
# servers write their output unbuffered (PYTHONUNBUFFERED) straight into the stack log: a server
# that refuses connections without this line in its log was not stopped, it died.
_SHUTDOWN_LINE = re.compile(r"\bShutting down\s*$")
# The first exception ng_run itself raised (`RuntimeError: Missing pyproject.toml ... <dir>`):
# the cause; what follows it (the head server's 500s while shutting down) is noise.
_FIRST_ERROR = re.compile(r"^\w*(Error|Exception): .+$", re.MULTILINE)
_SERVER_LINE = re.compile(r"^\([\w.-]+\) ")
# uvicorn's line when its listening socket cannot bind. NeMo Gym's head server runs in a thread
# of ng_run (its lines are unprefixed): after this line it never listens, and ng_run waits for it.
_BIND_ERROR = re.compile(r"error while attempting to bind on address \('[^']*', (\d+)\): .+$")
_CONFIG_DUMP_LINE = "Found global config dict yaml:"
# What death and stop paths read of the stack log: its end. The log of a long run is unbounded.
_LOG_TAIL_BYTES = 1 << 20
_LOG_LINE_BYTES = 1 << 16


def also_down(refusing: list[str], named: str) -> str:
    """The part of a death report listing the servers found down besides `named`."""
    others = [name for name in refusing if name != named]
    return f"; also down now: {', '.join(others)}" if others else ""


class NgRunLog:
    """See the module contract."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._ready_seen = False
        self._ready_scanned = 0

    def read(self) -> str:
        """The last `_LOG_TAIL_BYTES` of the stack log, from a line start ("" before the stack
        started or if unreadable). Bounded: a long run's log is."""
        if self.path is None:
            return ""
        try:
            with self.path.open("rb") as handle:
                start = max(0, handle.seek(0, os.SEEK_END) - _LOG_TAIL_BYTES)
                handle.seek(start)
                data = handle.read(_LOG_TAIL_BYTES)
        except OSError:
            return ""
        if start:
            data = data.partition(b"\n")[2]  # a cut first line would be misread
        return data.decode(errors="replace")

    def saw_ready_line(self) -> bool:
        """Whether ng_run printed its ready line. Reads the log a line at a time, each part once
        (from where the last call stopped), so memory stays bounded however long the log."""
        if self._ready_seen or self.path is None:
            return self._ready_seen
        with contextlib.suppress(OSError), self.path.open("rb") as handle:
            handle.seek(self._ready_scanned)
            while line := handle.readline(_LOG_LINE_BYTES):
                if not line.endswith(b"\n") and len(line) < _LOG_LINE_BYTES:
                    break  # still being written: read it whole next time
                self._ready_scanned += len(line)
                if _READY_LINE.search(line.decode(errors="replace")):
                    self._ready_seen = True
                    break
        return self._ready_seen

    def server_tail(self, name: str | None = None, n: int = 40) -> str:
        """The last `n` log lines of server `name` (NeMo Gym prefixes them "(name) "), or of
        the whole stack log."""
        lines = self.read().splitlines()
        if name is not None:
            prefix = f"({name}) "
            lines = [line for line in lines if line.startswith(prefix)]
        return "\n".join(lines[-n:])

    def ng_run_tail(self, n: int = 20, *, before_traceback: bool = False) -> str:
        """ng_run's own lines (not its servers'), cut before the config dump NeMo Gym prints
        after a config error: that dump buries the error and may hold unmasked values.

        With `before_traceback`, only what precedes ng_run's last traceback: a server that dies
        while importing writes its error unprefixed (NeMo Gym prefixes only later), so it lands
        there, above ng_run's own "finished unexpectedly" traceback."""
        lines: list[str] = []
        for line in self.read().splitlines():
            if _CONFIG_DUMP_LINE in line:
                break
            if not _SERVER_LINE.match(line):
                lines.append(line)
        if before_traceback:
            starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most")]
            if starts:
                lines = lines[: starts[-1]]
        return "\n".join(lines[-n:])

    def tail_for(self, names: set[str]) -> str:
        parts = [f"--- {name} ---\n{self.server_tail(name, 20)}" for name in sorted(names)]
        parts.append(f"--- ng_run ({self.path}) ---\n{self.ng_run_tail()}")
        return "\n".join(parts)

    def died_first(self) -> str | None:
        """The server NeMo Gym's first "Process `x` finished unexpectedly" line names, if any.

        Only ng_run's own (unprefixed) lines count: a server's output could quote the phrase."""
        for line in self.read().splitlines():
            if not _SERVER_LINE.match(line) and (died := _DIED_LINE.search(line)):
                return died.group(1)
        return None

    def bind_failure(self, port: int) -> str | None:
        """uvicorn's error, if ng_run's own (unprefixed) output says a server of ng_run's process
        (the head server) could not bind `port`."""
        for line in self.read().splitlines():
            error = None if _SERVER_LINE.match(line) else _BIND_ERROR.search(line)
            if error and int(error.group(1)) == port:
                return error.group(0)
        return None

    def shut_down_normally(self, name: str) -> bool:
        """Whether server `name`'s log shows uvicorn's graceful shutdown (see _SHUTDOWN_LINE)."""
        prefix = f"({name}) "
        return any(
            line.startswith(prefix) and _SHUTDOWN_LINE.search(line)
            for line in self.read().splitlines()
        )

    def death_message(self, code: int) -> str:
        if (name := self.died_first()) is not None:
            return (
                f"NeMo Gym server {name!r} died (ng_run exit {code}); its log:\n"
                f"{self.server_tail(name, 20)}\n"
                f"--- unprefixed output ({self.path}) ---\n"
                f"{self.ng_run_tail(20, before_traceback=True)}"
            )
        first = _FIRST_ERROR.search(self.ng_run_tail(10_000))
        cause = f": {first.group(0).strip()}" if first else ""
        return (
            f"NeMo Gym's ng_run exited with status {code}{cause}; log tail:\n{self.tail_for(set())}"
        )
