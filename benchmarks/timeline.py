"""What a benchmarked process emits, stamped from outside as it appears, and phases from it.

`watch` runs one command and, while it runs, records a timeline: every line of its output
(stdout and stderr; `\\r` ends a line too, as a progress bar redraws with it) when it arrives,
and, polled every `POLL` seconds, when each watched file appears and every line appended to it.
All stamps are seconds since the launch, on one monotonic clock, so a process's own log format
(verifiers logs whole seconds) does not bound their precision; the poll does (`POLL`).

`marks_of` finds named boundaries on a timeline (`Mark`: the n-th line of a source matching a
pattern, or a file's appearance) and `phases` turns ordered boundaries into phases that add up to
the wall time, with what they do not cover as `other`. A boundary that never showed is a
`PhaseError` naming it, never a zero.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from benchmarks.common import start_child

POLL = 0.02
"""Seconds between two looks at the watched files: the precision of a file's stamps."""

OUTPUT = "output"
"""The source name of the process's own stdout and stderr lines."""
EXIT = "exit"
"""The source name of the process's end (one event, its text the exit status)."""

Kind = Literal["line", "created", "exit"]


@dataclass(frozen=True)
class Event:
    """Something the process emitted: `t` seconds after its launch, from `source` (`OUTPUT`, a
    watched file's name, or `EXIT`); `kind` is a line, a file's appearance or the exit."""

    t: float
    source: str
    kind: Kind
    text: str = ""


class PhaseError(RuntimeError):
    """A boundary missing or out of order, or phases that do not add up to the wall time."""


@dataclass
class Tail:
    """A file a run writes, looked at each poll: where it is found (a glob under `root`, since
    a run may name its own folder) and the bytes read so far. `source` names it in events."""

    source: str
    root: Path
    pattern: str
    path: Path | None = None
    offset: int = 0
    partial: bytes = b""

    def poll(self, now: Callable[[], float], out: list[Event]) -> None:
        """Append to `out` this file's appearance (first poll that finds it) and each complete
        line added since the last poll, stamped `now()` once they are read: the time they were
        seen by, as an output line's stamp is the time it arrived by, so no stamp runs ahead
        of what it marks."""
        found = False
        if self.path is None:
            paths = sorted(self.root.glob(self.pattern))
            if not paths:
                return
            self.path, found = paths[0], True
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            data = b""
        t = now()
        if found:
            out.append(Event(t, self.source, "created"))
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        out.extend(Event(t, self.source, "line", _text(line)) for line in lines)


@dataclass
class Watched:
    """A finished run: its exit status, its output's last `TAIL` bytes, its wall seconds (launch
    to exit) and its timeline."""

    returncode: int
    output: str
    wall: float
    events: list[Event] = field(default_factory=list)


TAIL = 6000
"""Bytes of a run's output kept for error messages."""


async def watch(
    cmd: Sequence[str],
    tails: Sequence[Tail],
    *,
    env: dict[str, str],
    cwd: Path | None = None,
    timeout: float = 1800,
) -> Watched:
    """Run `cmd` (by `start_child`) to its end, recording its timeline: its output lines as they
    arrive, and each of `tails` polled every `POLL` seconds (and once more after the exit, so
    nothing written before it is missed; such lines carry the exit's stamp)."""
    began = time.monotonic()
    proc = await start_child(
        *cmd,
        env=env,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    events: list[Event] = []
    kept = bytearray()

    async def read() -> None:
        assert proc.stdout is not None
        partial = b""
        while chunk := await proc.stdout.read(65536):
            t = time.monotonic() - began
            kept.extend(chunk)
            del kept[:-TAIL]
            *lines, partial = (partial + chunk).replace(b"\r", b"\n").split(b"\n")
            events.extend(Event(t, OUTPUT, "line", _text(line)) for line in lines if line)
        if partial:
            events.append(Event(time.monotonic() - began, OUTPUT, "line", _text(partial)))

    def now() -> float:
        return time.monotonic() - began

    async def poll() -> None:
        while True:
            for tail in tails:
                tail.poll(now, events)
            await asyncio.sleep(POLL)

    poller = asyncio.ensure_future(poll())
    try:
        await asyncio.wait_for(asyncio.gather(read(), proc.wait()), timeout)
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    finally:
        poller.cancel()
    wall = time.monotonic() - began
    returncode = proc.returncode
    assert returncode is not None
    for tail in tails:
        tail.poll(lambda: wall, events)
    events.append(Event(wall, EXIT, "exit", str(returncode)))
    events.sort(key=lambda e: e.t)  # stable: within a stamp, the order they were seen in
    return Watched(returncode, bytes(kept).decode(errors="replace"), wall, events)


@dataclass(frozen=True)
class Mark:
    """A boundary: the `nth` (1-based) event of `source` of `kind` whose text matches `pattern`
    (any text if None). `what` says what it is, for the JSON and for errors."""

    source: str
    what: str
    kind: Kind = "line"
    pattern: re.Pattern[str] | None = None
    nth: int = 1

    def find(self, events: Sequence[Event]) -> float | None:
        """The stamp of this boundary on `events`, None if it never showed."""
        seen = 0
        for event in events:
            if event.source != self.source or event.kind != self.kind:
                continue
            if self.pattern is not None and not self.pattern.search(event.text):
                continue
            seen += 1
            if seen == self.nth:
                return event.t
        return None


ENDED = Mark(EXIT, "the process ended", kind="exit")


def marks_of(events: Sequence[Event], marks: dict[str, Mark], side: str) -> dict[str, float]:
    """The stamp of every boundary of `marks` on `events`; a PhaseError names the first one
    missing (`side` says whose run it was)."""
    found: dict[str, float] = {}
    for name, mark in marks.items():
        t = mark.find(events)
        if t is None:
            raise PhaseError(f"{side}: boundary {name!r} ({mark.what}) not seen")
        found[name] = t
    return found


def phases(
    marks: dict[str, float], order: Sequence[tuple[str, str]], wall: float, side: str
) -> dict[str, float]:
    """Phases from boundaries: `order` is (phase, boundary that ends it) in time order; the
    first phase starts at the launch (0). Returns each phase's seconds, `wall`, and `other`:
    the wall time the phases do not cover. PhaseError if a boundary is missing, comes before
    the one ahead of it, or the phases miss the wall time by more than 5 %."""
    out: dict[str, float] = {}
    previous_name, previous = "launch", 0.0
    for phase, boundary in order:
        if boundary not in marks:
            raise PhaseError(f"{side}: boundary {boundary!r} (end of {phase}) not seen")
        t = marks[boundary]
        if t < previous:
            raise PhaseError(
                f"{side}: boundary {boundary!r} at {t:.3f} s comes before {previous_name!r} "
                f"at {previous:.3f} s"
            )
        out[phase] = t - previous
        previous_name, previous = boundary, t
    covered = sum(out.values())
    if abs(wall - covered) > 0.05 * wall:
        raise PhaseError(f"{side}: phases add up to {covered:.3f} s of {wall:.3f} s wall")
    out["wall"] = wall
    out["other"] = wall - covered
    return {k: round(v, 3) for k, v in out.items()}


def _text(line: bytes) -> str:
    # A result line can be long; what a mark matches is near its start.
    return line[:500].decode(errors="replace").rstrip()


OWNERS = {"verifiers_nemogym": "ours", "nemo_gym_env": "ours", "verifiers": "verifiers"}
"""Top-level packages whose imports `import_profile` adds up apart (the rest: `other`)."""

_IMPORT_TIME = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def import_profile(output: str, top: int = 8) -> dict[str, object]:
    """What a process's imports cost, from its `-X importtime` lines in `output` (stderr of a
    run with PYTHONPROFILEIMPORTTIME=1): `total_s` (every module body run), `by_owner` (each
    module counted for the nearest of itself and the modules that imported it that belongs to
    a package of `OWNERS`, else `other`: what importing verifiers, or our package, pulled in)
    and `by_package` (module bodies' own seconds per top-level package, the `top` largest and
    the rest as `rest`). PhaseError if `output` holds no such line."""
    entries: list[tuple[int, str, float]] = []
    for line in output.splitlines():
        if found := _IMPORT_TIME.match(line):
            own_us, _, indent, name = found.groups()
            entries.append((len(indent) // 2, name, int(own_us) / 1e6))
    if not entries:
        raise PhaseError("no `import time:` lines in the output (PYTHONPROFILEIMPORTTIME unset?)")
    # The lines come children first; read backwards, each module comes after its importer.
    owners: dict[str, float] = {}
    packages: dict[str, float] = {}
    stack: list[tuple[int, str]] = []
    for depth, name, own in reversed(entries):
        while stack and stack[-1][0] >= depth:
            stack.pop()
        package = name.split(".")[0]
        owner = OWNERS.get(package) or (stack[-1][1] if stack else "other")
        stack.append((depth, owner))
        owners[owner] = owners.get(owner, 0.0) + own
        packages[package] = packages.get(package, 0.0) + own
    ranked = sorted(packages.items(), key=lambda item: -item[1])
    by_package = {name: round(s, 3) for name, s in ranked[:top]}
    by_package["rest"] = round(sum(s for _, s in ranked[top:]), 3)
    return {
        "total_s": round(sum(own for _, _, own in entries), 3),
        "by_owner": {name: round(s, 3) for name, s in sorted(owners.items())},
        "by_package": by_package,
    }
