"""Where a process's CPU goes, by whose code: `py-spy record` around a command, each sample
charged to an owner.

py-spy samples every running (not idle) thread of the process `SAMPLE_HZ` times a second
without pausing it; a sample stands for 1 / `SAMPLE_HZ` s of CPU. A sample's owner is that of
its innermost frame in an owner's code (`OWNERS`: ours, verifiers, NeMo Gym): a library's
frames (pydantic, json, aiohttp, the standard library) are charged to the code that called
them. A sample with no owner's frame is the `event_loop`'s: the loop, its sockets and the HTTP
libraries' own machinery between awaits, which serve whoever awaits. Samples of a stack
through the import system (`IMPORT_FRAME`) are start-up, counted apart (`import_s`, from
py-spy's attach, a few milliseconds after the process's start).
"""

from __future__ import annotations

import asyncio
import re
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import start_child

SAMPLE_HZ = 100
OWNERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ours", ("/verifiers_nemogym/", "/nemo_gym_env/")),
    ("verifiers", ("/verifiers/",)),
    ("nemo_gym", ("/nemo_gym/",)),
)
"""Owner -> path parts of its code's files, tried in this order."""
EVENT_LOOP = "event_loop"
IMPORT_FRAME = "_find_and_load"
SIGNATURE_FRAME = "_signature_fromstr"
"""inspect's parse of a builtin's text signature: what pydantic 2.14's `FieldInfo.get_default`
runs for a `default_factory=time.time` field at every model built (verifiers' trace nodes)."""
TOP = 6

_FRAME = re.compile(r"^(?P<func>.*) \((?P<path>[^()]*?)(?::\d+)?\)$")


@dataclass
class Profile:
    """What one sampled run's samples say, in CPU seconds (samples / `SAMPLE_HZ`)."""

    owners: Counter[str]
    """Owner (or `EVENT_LOOP`) -> CPU seconds outside imports."""
    top: dict[str, Counter[str]]
    """Owner -> its innermost function ("func (file)") -> CPU seconds."""
    import_s: float
    signature_s: float
    """CPU seconds under `SIGNATURE_FRAME` (charged to whoever built the model)."""


def frame_parts(frame: str) -> tuple[str, str]:
    """(function, file path) of one py-spy frame ("func (path:line)")."""
    found = _FRAME.match(frame)
    return (found["func"], found["path"]) if found else (frame, "")


def owner_of(path: str) -> str | None:
    for owner, parts in OWNERS:
        if any(part in path for part in parts):
            return owner
    return None


def read_raw(text: str) -> Profile:
    """A py-spy `--format raw` file (one "frame;frame;... count" line per distinct stack,
    outermost frame first) as a `Profile`."""
    owners: Counter[str] = Counter()
    top: dict[str, Counter[str]] = {}
    imports = signature = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n, frames = int(count), stack.split(";")
        if any(IMPORT_FRAME in frame for frame in frames):
            imports += n
            continue
        signature += n if any(SIGNATURE_FRAME in frame for frame in frames) else 0
        owner, where = EVENT_LOOP, ""
        for frame in reversed(frames):
            func, path = frame_parts(frame)
            if (found := owner_of(path)) is not None:
                owner, where = found, f"{func} ({Path(path).name})"
                break
        owners[owner] += n
        if where:
            top.setdefault(owner, Counter())[where] += n
    return Profile(
        owners=Counter({k: v / SAMPLE_HZ for k, v in owners.items()}),
        top={k: Counter({f: v / SAMPLE_HZ for f, v in c.items()}) for k, c in top.items()},
        import_s=imports / SAMPLE_HZ,
        signature_s=signature / SAMPLE_HZ,
    )


def per_rollout(profile: Profile, rollouts: int) -> dict[str, Any]:
    """`profile` as the benchmark's JSON: CPU milliseconds per rollout by owner (and in
    total), each owner's `TOP` functions, the import seconds and the signature parse."""
    ms = 1000.0 / rollouts
    return {
        "rollouts": rollouts,
        "sample_hz": SAMPLE_HZ,
        "cpu_ms_per_rollout": {k: round(v * ms, 2) for k, v in profile.owners.most_common()},
        "cpu_ms_per_rollout_total": round(sum(profile.owners.values()) * ms, 2),
        "top_ms_per_rollout": {
            owner: [[func, round(s * ms, 2)] for func, s in funcs.most_common(TOP)]
            for owner, funcs in profile.top.items()
        },
        "signature_ms_per_rollout": round(profile.signature_s * ms, 2),
        "import_s": round(profile.import_s, 2),
    }


async def record(
    cmd: list[str], env: dict[str, str], cwd: Path | None, timeout: float = 1800
) -> tuple[int | None, str, Profile]:
    """Run `cmd` (by `start_child`, so it dies with the benchmark) with `py-spy record` attached
    to it from its start to its exit (raw format, full file names, never pausing it): its exit
    status, its output (stdout and stderr), and the profile. RuntimeError if py-spy is not
    installed (the dev group has it) or wrote no samples."""
    spy = Path(sys.executable).with_name("py-spy")  # the venv's, as vf-eval's
    if not spy.exists():
        raise RuntimeError(f"{spy} is not installed: `uv sync` (py-spy is in the dev group)")
    with tempfile.TemporaryDirectory(prefix="vfng-bench-profile-") as tmp:
        raw = Path(tmp, "samples.txt")
        proc = await start_child(
            *cmd, env=env, cwd=cwd, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        sampler = await start_child(
            str(spy), "record", "--format", "raw", "--rate", str(SAMPLE_HZ), "--full-filenames",
            "--nonblocking", "-o", str(raw), "--pid", str(proc.pid),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
            _, spy_err = await asyncio.wait_for(sampler.communicate(), 60)  # it ends with it
        finally:
            for child in (proc, sampler):
                if child.returncode is None:
                    child.kill()
                    await child.wait()
        text = raw.read_text() if raw.exists() else ""
    if not text.strip():
        raise RuntimeError(f"py-spy wrote no samples: {spy_err.decode(errors='replace')[-2000:]}")
    return proc.returncode, out.decode(errors="replace"), read_raw(text)
