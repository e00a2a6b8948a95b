"""Long runs, ours and native side by side: `uv run python -m benchmarks.soak [--rollouts N]
[--in-flight K] [--window W] [--side ours|shared|native ...] [--together] [--trace-malloc]`

Each side runs `--rollouts` rollouts of example_single_tool_call against the scripted policy
(its own process) with `--in-flight` at a time, in a fresh Python process of its own, so that
"the driver" is measured alone:
- `ours`: `env.run_episode` (verifiers' rollout machinery, our harness and model proxy) on a
  private stack `env.serving()` starts; the driver process is the env process.
- `shared`: as `ours`, on the machine's shared stack (`shared_stack=True`, the default): the
  stack's host process (front, model-call relay, leases) is counted with the stack and also
  alone, and the stack's folder is the shared stack's.
- `native`: an aiohttp driver posting the rows to the agent's `/run` on a stack whose
  `policy_model` is the policy itself (NeMo Gym alone, as `steady_state`'s `raw_direct`).
The sides run one after the other, or with `--together` at the same time (one run, the same
machine load for both: their slopes compare, their rates share the cores).
The rollouts run in windows of `--window`; after each, with nothing in flight and after a full
garbage collection in the driver, a sample is taken: rollouts/s over the window, resident memory
(MiB) and open file descriptors of the driver, of every process of the stack (NeMo Gym's
servers, Ray, the supervisor: summed, and the largest one) and of the policy, the driver's
allocated Python memory blocks and its resident memory after glibc's `malloc_trim(0)` (without
the free pages its allocator keeps), and the bytes of the stack's working folder (logs included).
Sampling drained measures what is retained: a sample taken mid-flight reads the working set of
whichever rollouts are in the driver at that instant, which follows the machine's load. Growth
per 10,000 rollouts is the least-squares slope over the samples after the first fifth of the run
(warm-up: imports, connection pools, Ray workers, caches filling). Errors are counted (and the
first quoted), never retried.

Writes `benchmarks/results/<date>-soak.json` (or `--out`) and prints one line per sample. The
sides inherit this process's environment: `MALLOC_ARENA_MAX=2 python -m benchmarks.soak` measures
both with glibc's malloc arenas capped (recorded in the result). `--trace-malloc` also lists the
allocation sites whose retained bytes changed most in the driver from the first sample after the
first fifth to the last (`tracemalloc`, which slows the driver about threefold).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import datetime
import gc
import json
import math
import os
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks.common import ENV, rss_mb, spawn_policy, start_child

RESULTS = Path(__file__).with_name("results")
SIDES = ("ours", "native", "shared")


def fds(pid: int) -> int:
    """Open file descriptors of `pid` (0 if it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def folder_bytes(path: Path | None) -> int:
    """Bytes of the regular files below `path` (sockets and vanished files skipped)."""
    total = 0
    for root, _, files in os.walk(path) if path else ():
        for name in files:
            with contextlib.suppress(OSError):  # a file removed while walking
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def sample(driver: int, stack: list[int], policy: int, workdir: Path | None) -> dict[str, Any]:
    """Memory, descriptors and folder size of the run's processes now (see the module doc)."""
    stack_rss = {pid: _rss(pid) for pid in stack}
    return {
        "driver_rss_mb": _rss(driver),
        "driver_fds": fds(driver),
        "stack_rss_mb": sum(stack_rss.values()),
        "stack_max_rss_mb": max(stack_rss.values(), default=0.0),
        "stack_processes": len(stack),
        "stack_fds": sum(fds(pid) for pid in stack),
        "policy_rss_mb": _rss(policy),
        "policy_fds": fds(policy),
        "workdir_mb": folder_bytes(workdir) / 2**20,
    }


def _rss(pid: int) -> float:
    try:
        return rss_mb(pid)
    except RuntimeError:
        return 0.0


Run = tuple[list[dict[str, Any]], int, str | None]
"""A soak's samples, its error count and its first error's text."""


async def drive(
    total: int,
    in_flight: int,
    window: int,
    one: Callable[[int], Awaitable[None]],
    measure: Callable[[], dict[str, Any]],
    malloc: MallocTrace | None = None,
) -> Run:
    """Run `one(i)` for i < total, `in_flight` at a time, in windows of `window` rollouts. After
    each window, with nothing in flight and after a full garbage collection, append `measure()`
    plus the window's rate, this (the driver's) process's allocated Python memory blocks and its
    resident memory once its allocator returned its free pages (`_trimmed_rss_mb`): retained
    memory, not the working set of whichever rollouts happen to be in flight. `malloc`,
    if given, starts tracing at the first sample after the first fifth and is read at the last.
    Returns the samples, the error count and the first error's text."""
    samples: list[dict[str, Any]] = []
    errors = 0
    first_error: str | None = None
    began = time.monotonic()
    for start in range(0, total, window):
        end = min(start + window, total)
        issued = start
        window_began = time.monotonic()

        async def worker(end: int) -> None:
            nonlocal issued, errors, first_error
            while issued < end:
                i = issued
                issued += 1
                try:
                    await one(i)
                except Exception as exc:  # counted, reported; a soak does not stop at one error
                    errors += 1
                    first_error = first_error or f"{type(exc).__name__}: {exc}"[:500]

        await asyncio.gather(*(worker(end) for _ in range(min(in_flight, end - start))))
        now = time.monotonic()
        gc.collect()
        point = {"done": end, "seconds": now - began, "rps": (end - start) / (now - window_began)}
        point |= measure()
        point["driver_py_blocks"] = sys.getallocatedblocks()
        point["driver_rss_trimmed_mb"] = _trimmed_rss_mb()
        point["errors"] = errors
        samples.append(point)
        print(json.dumps(point), file=sys.stderr, flush=True)
        if malloc and (end >= total or (not malloc.tracing and end >= total // 5)):
            malloc.mark()
    return samples, errors, first_error


def _trimmed_rss_mb() -> float:
    """This process's resident memory (MiB) after glibc's `malloc_trim(0)` gave the free pages
    its allocator keeps back to the system: memory in use plus fragmentation, without the
    high-water mark of a burst freed since (the untrimmed RSS swings by tens of MB with them)."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the untrimmed figure
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_mb(os.getpid())


class MallocTrace:
    """Where the driver's retained Python memory grew (`--trace-malloc`): `tracemalloc`
    (one frame, so allocation sites, not callers; it slows the driver about threefold) from a
    first mark to a second, both taken with nothing in flight; `top()` lists the sites whose
    retained bytes changed most, as paths below site-packages or the repository."""

    def __init__(self) -> None:
        self.tracing = False
        self.snapshots: list[tracemalloc.Snapshot] = []

    def mark(self) -> None:
        if not self.tracing:
            tracemalloc.start(1)
            self.tracing = True
        self.snapshots.append(tracemalloc.take_snapshot())

    def top(self, n: int = 15) -> dict[str, Any]:
        first, last = self.snapshots[0], self.snapshots[-1]
        ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
        stats = last.filter_traces(ignore).compare_to(first.filter_traces(ignore), "lineno")
        return {
            "total_kib": sum(s.size_diff for s in stats) / 1024,
            "sites": [_site(stat) for stat in stats[:n]],
        }


def _site(stat: tracemalloc.StatisticDiff) -> dict[str, Any]:
    """One allocation site's change, its path without the machine's part (from its package,
    the repository or the standard library on)."""
    frame = stat.traceback[0]
    path = frame.filename
    for root in ("site-packages/", f"{Path(__file__).parent.parent}/", "/lib/"):
        if root in path:
            path = path.split(root, 1)[1]
            break
    kib = stat.size_diff / 1024
    return {"site": f"{path}:{frame.lineno}", "kib": kib, "blocks": stat.count_diff}


async def run_side(
    side: str, total: int, in_flight: int, window: int, trace_malloc: bool = False
) -> dict[str, Any]:
    """One side's soak in this process (see the module doc)."""
    import aiohttp
    import verifiers.v1 as vf
    from verifiers.v1.configs.client import EvalClientConfig

    import nemo_gym_env
    from benchmarks.native import native_stack
    from verifiers_nemogym.nemo.supervisor import processes_with_marker
    from verifiers_nemogym.stack_access import PrivateStack, SharedStack

    os.environ.setdefault("SCRIPTED_KEY", "unused")
    malloc = MallocTrace() if trace_malloc else None
    async with await spawn_policy() as policy:
        shared = side == "shared"
        env: Any = nemo_gym_env.load_environment(nemo_env=ENV, shared_stack=shared)
        tasks = list(env.taskset)

        def soak(
            marker: str, workdir: Path | None, one: Callable[[int], Awaitable[None]], host: int = 0
        ) -> Awaitable[Run]:
            def measure() -> dict[str, Any]:
                pids = sorted(set(processes_with_marker(marker)) | ({host} if host else set()))
                figures = sample(os.getpid(), pids, policy.pid, workdir)
                if host:  # the shared stack's host process, also counted with the stack
                    figures |= {"host_rss_mb": _rss(host), "host_fds": fds(host)}
                return figures

            return drive(total, in_flight, window, one, measure, malloc)

        if side in ("ours", "shared"):
            client = EvalClientConfig(base_url=policy.info["base_url"], api_key_var="SCRIPTED_KEY")
            ctx = vf.ModelContext(model="scripted", client=client)

            async def ours(i: int) -> None:
                episode = await env.run_episode(tasks[i % len(tasks)], ctx)
                if not episode.ok:
                    raise RuntimeError(f"rollout failed: {episode.errors}")

            async with env.serving():
                stack = env.stack
                if isinstance(stack, PrivateStack):
                    run = soak(stack.process.marker, stack.process.workdir, ours)
                elif isinstance(stack, SharedStack):
                    lease = stack.lease
                    run = soak(lease.marker, lease.directory, ours, host=lease.host_pid)
                else:  # start() logs and carries on
                    raise RuntimeError(f"the stack did not start: {env.start_error}")
                samples, errors, first = await run
        else:
            port = int(policy.info["port"])
            stack = native_stack(env.taskset.nemo_venv, env.taskset.config_paths(), port)
            http = aiohttp.ClientSession(
                cookie_jar=aiohttp.DummyCookieJar(),
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=600),
            )

            async def native(i: int) -> None:
                data = tasks[i % len(tasks)].data
                async with http.post(f"{stack.agents[data.agent]}/run", json=data.row) as reply:
                    body = await reply.json()
                    if reply.status != 200 or body.get("reward") != 1.0:
                        raise RuntimeError(f"/run answered {reply.status}: {str(body)[:300]}")

            try:
                await stack.start()
                samples, errors, first = await soak(stack.marker, stack.workdir, native)
            finally:
                await stack.stop()
                await http.close()
    result = {"samples": samples, "errors": errors, "first_error": first}
    if malloc and len(malloc.snapshots) > 1:
        result["malloc_growth"] = malloc.top()
    return result


GROWTH_KEYS = ("driver_rss_mb", "driver_rss_trimmed_mb", "driver_py_blocks", "stack_rss_mb",
               "stack_max_rss_mb", "policy_rss_mb", "driver_fds", "stack_fds", "policy_fds",
               "workdir_mb", "rps", "host_rss_mb", "host_fds")  # fmt: skip


def growth_per_10k(samples: list[dict[str, Any]], key: str) -> tuple[float, float] | None:
    """Least-squares slope of `key` against finished rollouts, per 10,000 rollouts, over the
    samples after the first fifth of the run, and the slope's standard error (how far noise
    alone moves it); None with fewer than 3 such samples."""
    points = samples[len(samples) // 5 :]
    if len(points) < 3:
        return None
    xs = [float(p["done"]) for p in points]
    ys = [float(p[key]) for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys, strict=True))
    return slope * 10_000, math.sqrt(residual / (len(xs) - 2) / var) * 10_000


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """`result` plus, per key, `growth_per_10k` and its standard error `growth_se_per_10k`
    (`growth_per_10k`), and the first/last sample's figures."""
    samples = result["samples"]
    keys = [key for key in GROWTH_KEYS if samples and key in samples[0]]
    fits = {key: growth_per_10k(samples, key) for key in keys}
    result["growth_per_10k"] = {key: fit and fit[0] for key, fit in fits.items()}
    result["growth_se_per_10k"] = {key: fit and fit[1] for key, fit in fits.items()}
    if samples:
        result["first"] = {k: samples[0][k] for k in keys}
        result["last"] = {k: samples[-1][k] for k in keys}
    return result


TABLE = (
    ("driver_rss_mb", "driver RSS, MB (ours, shared: the env process)", 1, 1),
    ("driver_rss_trimmed_mb", "driver RSS after malloc_trim, MB", 1, 1),
    ("driver_py_blocks", "driver's allocated Python blocks, thousands", 1_000, 1),
    ("stack_rss_mb", "stack processes summed, MB", 1, 1),
    ("stack_max_rss_mb", "largest stack process, MB", 1, 1),
    ("host_rss_mb", "the shared stack's host process, MB", 1, 1),
    ("driver_fds", "driver file descriptors", 1, 0),
    ("stack_fds", "stack file descriptors, summed", 1, 0),
    ("workdir_mb", "stack folder (logs included), MB", 1, 2),
    ("rps", "rollouts/s", 1, 1),
)
"""The docs' soak table: key, label, divisor, decimals."""


def table(sides: dict[str, dict[str, Any]]) -> list[str]:
    """docs/performance.md's soak table (Markdown rows) for summarized sides (`summarize`): per
    figure and side, growth per 10,000 rollouts ± its standard error, then first -> last."""
    names = [side for side in SIDES if side in sides]
    rows = [
        "| per 10,000 rollouts: slope ± standard error (first -> last sample) | "
        + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]  # fmt: skip
    for key, label, divisor, decimals in TABLE:
        if all(key not in sides[side]["growth_per_10k"] for side in names):
            continue  # a figure no side measured (an older run, or not this kind of stack)
        cells = []
        for side in names:
            result = sides[side]
            growth = result["growth_per_10k"].get(key)
            if growth is None:
                cells.append("-")
                continue
            se = result["growth_se_per_10k"][key]
            first, last = result["first"][key] / divisor, result["last"][key] / divisor
            cells.append(
                f"{growth / divisor:+.{decimals}f} ± {se / divisor:.{decimals}f} "
                f"({first:.{decimals}f} -> {last:.{decimals}f})"
            )
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return rows


async def run_child(
    side: str, total: int, in_flight: int, window: int, trace_malloc: bool
) -> dict[str, Any]:
    """Run one side in a fresh `python -m benchmarks.soak --child SIDE` process; its samples
    stream to this process's stderr, its result is the one JSON line it prints. It dies with
    this process (`start_child`), its policy with it, and its stack's supervisor then stops the
    stack."""
    proc = await start_child(
        sys.executable, "-m", "benchmarks.soak", "--child", side, "--rollouts", str(total),
        "--in-flight", str(in_flight), "--window", str(window),
        *(["--trace-malloc"] if trace_malloc else []),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the {side} soak exited with status {proc.returncode}")
    return summarize(json.loads(out.decode().strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--in-flight", type=int, default=256)
    parser.add_argument("--window", type=int, default=2_000)
    parser.add_argument("--side", action="append", choices=SIDES)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--trace-malloc", action="store_true",
        help="also list where the driver's retained Python memory grew (tracemalloc; ~3x slower)",
    )  # fmt: skip
    parser.add_argument(
        "--together", action="store_true",
        help="run the sides at the same time (each still in its own process) rather than in turn",
    )  # fmt: skip
    parser.add_argument(
        "--summarize", type=Path, metavar="RESULT",
        help="recompute the growth figures of a result file from its samples, and exit",
    )  # fmt: skip
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        side_result = asyncio.run(
            run_side(args.child, args.rollouts, args.in_flight, args.window, args.trace_malloc)
        )
        print(json.dumps(side_result), flush=True)
        return
    if args.summarize:
        earlier = json.loads(args.summarize.read_text())
        for side in SIDES:
            if side in earlier:
                summarize(earlier[side])
        args.summarize.write_text(json.dumps(earlier, indent=2) + "\n")
        return
    sides = args.side or list(SIDES)
    day = datetime.date.today().isoformat()
    result: dict[str, Any] = {
        "date": day,
        "command": "python -m benchmarks.soak " + " ".join(sys.argv[1:]),
        "environment": ENV,
        "rollouts": args.rollouts,
        "in_flight": args.in_flight,
        "window": args.window,
        "trace_malloc": args.trace_malloc,
        "together": args.together,
        "load_average_start": os.getloadavg(),
        # glibc's arenas: per-thread heaps a long-lived threaded process fragments (docs).
        "MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX"),
    }
    path = args.out or RESULTS / f"{day}-soak.json"

    async def one(side: str) -> None:
        began = time.monotonic()
        result[side] = await run_child(
            side, args.rollouts, args.in_flight, args.window, args.trace_malloc
        )
        result[side]["wall_s"] = time.monotonic() - began
        result["load_average_end"] = os.getloadavg()
        # Written after each side: a long soak's first side survives a stop during the second.
        path.write_text(json.dumps(result, indent=2) + "\n")

    async def run_sides() -> None:
        if args.together:
            await asyncio.gather(*map(one, sides))
        else:
            for side in sides:
                await one(side)

    asyncio.run(run_sides())
    for side in sides:
        print(side, json.dumps(result[side]["growth_per_10k"]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
