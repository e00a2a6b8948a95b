"""`uv run python -m benchmarks [--repeats N] [--cold-repeats N] [--only FIGURE ...]`

Measures verifiers-nemogym side by side with native NeMo Gym in one run (see the figure
modules), prints a table with the targets and writes `benchmarks/results/<date>.json`: the
headline medians at top level, every figure's repeats under `spread` and `details`.
Ours and native are interleaved within each repeat; ratios are taken within a repeat, then the
median over repeats, so slow phases of a shared machine hit both sides.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import end_to_end, prime_rl, proxy_hop, stack_start, steady_state, warm, workers
from benchmarks.common import PYTHON_VAR, VERSION_VAR, bench_runtime, spawn_policy, summary
from benchmarks.native import rows_file
from verifiers_nemogym.nemo.venv import BELOW_FLOOR_ENV_VAR, DEFAULT_NEMO_GYM_VERSION

FIGURES = ("proxy", "steady", "e2e", "start", "warm", "workers", "prime_rl")
RELEASE_FIGURES = ("e2e", "start", "warm", "prime_rl")
"""The figures that can run another nemo-gym release (`--nemo-gym-version`), both sides on it."""
RESULTS = Path(__file__).with_name("results")

# key: (target text, test of the median)
TARGETS: dict[str, tuple[str, Any]] = {
    "end_to_end_ratio": ("<= 0.8x native", lambda v: v <= 0.8),
    "steady_state_ratio": (">= 0.9x raw driver", lambda v: v >= 0.9),
    "proxy_p50_ms": ("<= 0.5 ms added", lambda v: v <= 0.5),
    "proxy_rps_ratio": (">= 0.5x bare server", lambda v: v >= 0.5),
    "stack_start_warm_ratio": ("<= 0.7x native", lambda v: v <= 0.7),
    "rss_growth_mb": ("flat (< 5 MB)", lambda v: v < 5),
    "stack_attach_s": ("<= 1 s", lambda v: v <= 1),
    "end_to_end_warm_ratio": ("<= 0.5x native", lambda v: v <= 0.5),
}


async def run_proxy(repeats: int, out: dict[str, Any]) -> None:
    runs = [await proxy_hop.measure_once() for _ in range(repeats)]
    keys = runs[0].keys()
    out["details"]["proxy"] = {k: summary([r[k] for r in runs]) for k in keys}
    pick = {
        "proxy_p50_ms": "added_p50_ms_at_1",
        "proxy_p99_ms": "added_p99_ms_at_1",
        "proxy_rps": "proxy_rps_at_256",
        "proxy_rps_ratio": "proxy_rps_ratio",
        # The same two figures for a bare aiohttp forwarder: the floor of any aiohttp proxy.
        "forwarder_p50_ms": "forwarder_added_p50_ms_at_1",
        "forwarder_rps_ratio": "forwarder_rps_ratio",
        "rss_mb_after_100": "rss_mb_after_100",
        "rss_mb_after_1000": "rss_mb_after_1000",
    }
    for key, source in pick.items():
        out["spread"][key] = summary([r[source] for r in runs])
    out["spread"]["rss_growth_mb"] = summary(
        [r["rss_mb_after_1000"] - r["rss_mb_after_100"] for r in runs]
    )


async def run_steady(repeats: int, out: dict[str, Any]) -> None:
    rates, cpu_ms = await steady_state.measure(repeats)
    out["details"]["steady_state_rps"] = {k: summary(v) for k, v in rates.items()}
    out["details"]["steady_state_cpu_ms_per_rollout"] = {
        way: {part: summary(v) for part, v in parts.items()} for way, parts in cpu_ms.items()
    }
    totals = {
        way: [sum(r) for r in zip(*parts.values(), strict=True)] for way, parts in cpu_ms.items()
    }
    out["spread"]["steady_state_cpu_ms_ours"] = summary(totals["ours"])
    out["spread"]["steady_state_cpu_ms_raw"] = summary(totals["raw_direct"])
    # What the rate ratio would be if CPU were the only limit (both sides CPU-bound).
    out["spread"]["steady_state_cpu_ratio"] = summary(_ratios(totals["raw_direct"], totals["ours"]))
    ours, direct, via = rates["ours"], rates["raw_direct"], rates["raw_proxy"]
    out["spread"]["steady_state_ratio"] = summary(_ratios(ours, direct))
    out["spread"]["steady_state_ratio_vs_raw_proxy"] = summary(_ratios(ours, via))
    out["spread"]["raw_proxy_vs_raw_direct"] = summary(_ratios(via, direct))


async def run_e2e(repeats: int, out: dict[str, Any]) -> None:
    runtime = bench_runtime()
    ours: list[float] = []
    native: list[float] = []
    async with await spawn_policy() as policy:
        for r in range(repeats):
            order = ["ours", "native"] if r % 2 == 0 else ["native", "ours"]
            for side in order:
                if side == "ours":
                    ours.append(await end_to_end.ours_once(runtime, policy.info["base_url"]))
                else:
                    native.append(await end_to_end.native_once(runtime, int(policy.info["port"])))
    out["details"]["end_to_end_s"] = {"ours": summary(ours), "native": summary(native)}
    out["spread"]["end_to_end_ratio"] = summary(_ratios(ours, native))


async def run_start(repeats: int, cold_repeats: int, out: dict[str, Any]) -> None:
    runs: dict[str, list[dict[str, float]]] = {"ours": [], "native": [], "ours_cold": []}
    for r in range(repeats):
        for side in ["ours", "native"] if r % 2 == 0 else ["native", "ours"]:
            runs[side].append(await stack_start.measure(side, cold=False))
    for _ in range(cold_repeats):
        runs["ours_cold"].append(await stack_start.measure("ours", cold=True))
    out["details"]["stack_start_s"] = {
        side: {phase: summary([m[phase] for m in ms]) for phase in ms[0]}
        for side, ms in runs.items()
        if ms
    }
    ours = [m["total"] for m in runs["ours"]]
    native = [m["total"] for m in runs["native"]]
    out["spread"]["stack_start_warm_s"] = summary(ours)
    out["spread"]["stack_start_native_warm_s"] = summary(native)
    out["spread"]["stack_start_warm_ratio"] = summary(_ratios(ours, native))
    if runs["ours_cold"]:
        cold = [m["runtime"] + m["total"] for m in runs["ours_cold"]]
        out["spread"]["stack_start_cold_s"] = summary(cold)


async def run_warm(repeats: int, out: dict[str, Any]) -> None:
    """Both stacks up (not timed), then `repeats` interleaved 100-rollout runs of each side
    (ours, ours with `--no-rich`, native), with
    each run's phases (`details.warm_phases`: per repeat, their medians, the load averages),
    then one import-profiled run per side (`imports`)."""
    runtime = bench_runtime()
    runs: dict[str, list[warm.Run]] = {"ours": [], warm.NO_RICH: [], "native": []}
    sides = list(runs)
    load_before = os.getloadavg()
    async with await spawn_policy() as policy:
        stack = warm.native(runtime, int(policy.info["port"]))
        await warm.bring_up(runtime)
        try:
            await stack.start()
            with tempfile.TemporaryDirectory(prefix="vfng-bench-warm-") as tmp:
                rows = rows_file(runtime, Path(tmp))
                for r in range(repeats):
                    # The order turns every repeat, so no side always follows the same one.
                    for side in sides[r % 3 :] + sides[: r % 3]:
                        if side != "native":
                            runs[side].append(
                                await warm.ours_once(
                                    runtime, policy.info["base_url"], rich=side == "ours"
                                )
                            )
                        else:
                            runs[side].append(
                                await warm.native_once(runtime, stack, rows, Path(tmp))
                            )
                # After the timed runs, so the profiler's overhead slows none of them.
                imports = {
                    "ours": await warm.ours_imports(runtime, policy.info["base_url"]),
                    "native": await warm.native_imports(runtime, stack, rows, Path(tmp)),
                }
                cpu = {
                    "ours": await warm.ours_cpu(runtime, policy.info["base_url"]),
                    "native": await warm.native_cpu(runtime, stack, rows, Path(tmp)),
                }
        finally:
            await stack.stop()
            await warm.take_down(runtime)
    ours = [run.wall for run in runs["ours"]]
    native = [run.wall for run in runs["native"]]
    no_rich = [run.wall for run in runs[warm.NO_RICH]]
    out["details"]["end_to_end_warm_s"] = {
        "ours": summary(ours),
        warm.NO_RICH: summary(no_rich),
        "native": summary(native),
    }
    out["details"]["warm_phases"] = warm_phases(runs, load_before, os.getloadavg())
    for side, profile in imports.items():
        out["details"]["warm_phases"][side]["imports"] = profile
    out["details"]["warm_phases"]["imports_of"] = (
        "one more run per side after the timed ones, not timed, with PYTHONPROFILEIMPORTTIME=1"
    )
    for side, profile in cpu.items():
        out["details"]["warm_phases"][side]["cpu"] = profile
    out["details"]["warm_phases"]["cpu_of"] = (
        "one more run per side after those, not timed, its client process (vf-eval; NeMo Gym's "
        "collector) sampled by py-spy (benchmarks/cpu_profile.py)"
    )
    out["spread"]["stack_attach_s"] = summary(
        [run.attach for run in runs["ours"] if run.attach is not None]
    )
    out["spread"]["end_to_end_warm_ratio"] = summary(_ratios(ours, native))
    out["spread"]["end_to_end_warm_no_rich_ratio"] = summary(_ratios(no_rich, native))


def warm_phases(
    runs: dict[str, list[warm.Run]], before: tuple[float, ...], after: tuple[float, ...]
) -> dict[str, Any]:
    """Per side: each phase's median over the repeats (`phases`; with `wall` and `other`), every
    repeat's phases and load (`each`), and what its boundaries are; the load averages (1, 5,
    15 minutes) before and after the figure."""
    order = {"ours": warm.OURS_PHASES, "native": warm.NATIVE_PHASES}
    marks = {"ours": warm.OURS_MARKS, "native": warm.NATIVE_MARKS}
    result: dict[str, Any] = {}
    for side, side_runs in runs.items():
        kind = "native" if side == "native" else "ours"  # NO_RICH is a vf-eval like ours
        names = [phase for phase, _ in order[kind]] + ["wall", "other"]
        result[side] = {
            "phases": {
                name: round(statistics.median(run.phases[name] for run in side_runs), 3)
                for name in names
            },
            "phases_of": "median",
            "each": [{**run.phases, "load_before_1m": run.load_before} for run in side_runs],
            "boundaries": {phase: marks[kind][end].what for phase, end in order[kind]},
            "unseparated": warm.UNSEPARATED[kind],
        }
    result["load_avg_before"] = [round(x, 2) for x in before]
    result["load_avg_after"] = [round(x, 2) for x in after]
    return result


async def run_workers(repeats: int, out: dict[str, Any]) -> None:
    """Env-server pools of 1, 2, 4 workers on one shared stack (and 1 on a private stack)."""
    runs = await workers.measure(repeats)
    rps = runs["rps"]
    for n in workers.SHARED_WORKERS:
        out["spread"][f"workers_rps_{n}"] = summary(rps[f"shared_{n}"])
    for n in workers.SHARED_WORKERS[1:]:
        out["spread"][f"workers_rps_{n}_over_1"] = summary(
            _ratios(rps[f"shared_{n}"], rps["shared_1"])
        )
    out["spread"]["front_hop_rps_ratio"] = summary(_ratios(rps["shared_1"], rps["private_1"]))
    out["spread"]["shared_stack_rss_mb"] = summary(runs["shared_stack_rss_mb"])
    private = runs["private_2"]
    if "error" in private:  # the rest of the figure stands; the table shows the gap
        out.setdefault("errors", {})["workers_private_2"] = private["error"]
    else:
        out["spread"]["private_stacks_rss_mb_2"] = summary([private["stacks_rss_mb"]])
    out["details"]["workers"] = {
        "rollouts": workers.N,
        "in_flight": workers.IN_FLIGHT,
        "rps": {name: summary(v) for name, v in rps.items()},
        "worker_rss_mb": {name: summary(v) for name, v in runs["worker_rss_mb"].items()},
        "private_1_stack_rss_mb": runs["private_1_stack_rss_mb"],
        "rss_mb_by_program": runs["rss_by_program"],
        "private_2": private,
        "programs_shared": runs["programs_shared"],
        "shared_stack_users": runs["users"],
    }


async def run_prime_rl(repeats: int, out: dict[str, Any]) -> None:
    """prime-rl's path: the taskset loaded on an empty cache, and the first reward through an
    env server against NeMo Gym's own first `/run` (interleaved)."""
    version = bench_runtime().nemo_gym_version
    loads = [await prime_rl.load_once(version) for _ in range(repeats)]
    for key in loads[0]:
        out["spread"][key] = summary([m[key] for m in loads])
    ours: list[float] = []
    native: list[float] = []
    async with await spawn_policy() as policy:
        for r in range(repeats):
            for side in ["ours", "native"] if r % 2 == 0 else ["native", "ours"]:
                if side == "ours":
                    ours.append(await prime_rl.first_reward_once(version, policy.info["base_url"]))
                else:
                    native.append(await prime_rl.native_first_reward_once(int(policy.info["port"])))
    out["spread"]["first_reward_s"] = summary(ours)
    out["spread"]["native_first_reward_s"] = summary(native)
    out["spread"]["first_reward_ratio"] = summary(_ratios(ours, native))


def _ratios(a: list[float], b: list[float]) -> list[float]:
    return [x / y for x, y in zip(a, b, strict=True)]


def _table(result: dict[str, Any]) -> str:
    rows = [("figure", "median", "min..max", "n", "target", "")]
    for key, s in result["spread"].items():
        target, test = TARGETS.get(key, ("", None))
        verdict = (
            ""
            if test is None or s["median"] is None
            else ("met" if test(s["median"]) else "MISSED")
        )
        rows.append(
            (
                key,
                f"{s['median']:.3f}",
                f"{s['min']:.3f}..{s['max']:.3f}",
                str(s["n"]),
                target,
                verdict,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"spread": {}, "details": {}}
    began = time.monotonic()
    figures = args.only or list(FIGURES)
    steps = {
        "proxy": lambda: run_proxy(args.repeats, out),
        "steady": lambda: run_steady(args.repeats, out),
        "e2e": lambda: run_e2e(args.repeats, out),
        "start": lambda: run_start(args.repeats, args.cold_repeats, out),
        "warm": lambda: run_warm(args.repeats, out),
        "workers": lambda: run_workers(args.repeats, out),
        "prime_rl": lambda: run_prime_rl(args.repeats, out),
    }
    for name in FIGURES:
        if name not in figures:
            continue
        step_began = time.monotonic()
        try:
            await steps[name]()
        except Exception as e:  # one broken figure must not cost the others
            out.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"[-3000:]
            print(f"figure {name} failed: {e!r}", flush=True)
        print(f"figure {name}: {time.monotonic() - step_began:.0f} s", flush=True)
    headline = {key: s["median"] for key, s in out["spread"].items()}
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "uv run python -m benchmarks " + " ".join(args.argv),
        "nemo_gym_version": args.nemo_gym_version or DEFAULT_NEMO_GYM_VERSION,
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_1m_at_end": os.getloadavg()[0],
            "python": platform.python_version(),
        },
        "seconds": time.monotonic() - began,
        **headline,
        "targets": {k: t for k, (t, _) in TARGETS.items()},
        **out,
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line; a bad combination exits with argparse's one-line usage error."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each figure")
    parser.add_argument("--cold-repeats", type=int, default=1, help="cold stack starts")
    parser.add_argument("--only", nargs="+", choices=FIGURES, help="run only these figures")
    parser.add_argument("--out", type=Path, help="JSON path (default results/<date>.json)")
    parser.add_argument(
        "--nemo-gym-version",
        help=f"another nemo-gym release for both sides (figures {', '.join(RELEASE_FIGURES)}, "
        "warm stack starts only; its runtime must exist, e.g. from the tests)",
    )
    parser.add_argument("--python", help="the Python of that release's runtime (path)")
    parser.add_argument(
        "--allow-python-below-floor",
        action="store_true",
        help="that Python may be below the release's declared floor (the package's opt-in)",
    )
    args = parser.parse_args(argv)
    args.argv = argv
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        # Measured 2026-11-29: warm vf-eval's start 9.8 s without cached bytecode, 4.4 s with.
        parser.error(
            "PYTHONDONTWRITEBYTECODE is set: every Python process of both sides would compile "
            "its modules from source at each start; unset it"
        )
    if args.nemo_gym_version:
        if not args.only or not set(args.only) <= set(RELEASE_FIGURES):
            parser.error(
                f"--nemo-gym-version needs --only with figures among {', '.join(RELEASE_FIGURES)}"
            )
        if "start" in args.only and args.cold_repeats:
            # A cold start builds a runtime in a fresh cache: the release's wheels and Python
            # are not to be had here (see the 0.7 notes), only its existing runtime is.
            parser.error("--nemo-gym-version with the start figure needs --cold-repeats 0")
    elif args.python or args.allow_python_below_floor:
        parser.error("--python and --allow-python-below-floor go with --nemo-gym-version")
    return args


def main() -> None:
    import sys

    args = parse_args(sys.argv[1:])
    if args.nemo_gym_version:
        # Read by `common.bench_runtime` here and in the fresh processes some figures are
        # measured in (benchmarks.stack_start); both sides always run this one release.
        os.environ[VERSION_VAR] = args.nemo_gym_version
        if args.python:
            os.environ[PYTHON_VAR] = args.python
        if args.allow_python_below_floor:
            os.environ[BELOW_FLOOR_ENV_VAR] = "1"
    result = asyncio.run(main_async(args))
    print(_table(result))
    suffix = f"-nemo-gym-{args.nemo_gym_version}" if args.nemo_gym_version else ""
    path = args.out or RESULTS / f"{datetime.date.today().isoformat()}{suffix}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {path}")


if __name__ == "__main__":
    main()
