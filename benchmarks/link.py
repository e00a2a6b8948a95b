"""Rollouts/s over a link between two hosts vs loopback: `uv run python -m benchmarks.link
[--rollouts N] [--in-flight K ...] [--repeats R] [--placement P ...] [--delay-ms D] [--out PATH]`

Root only: the hosts are network namespaces on one machine (`benchmarks/netns.py`, as in
`tests/stack/test_across_hosts.py`). One shared stack of example_single_tool_call runs in host A,
started by `nemo-gym-env stack up --listen A:PORT` (TLS, pinned certificate, access token). The
same workload, N rollouts of the scripted policy with K in flight through `env.run_episode` in
one env process, runs in each placement (PLACEMENTS):
- `local`: the env process in A, attached to the stack as any local user (its loopback, the
  stack folder's unix socket): the plain shared stack.
- `tls_local`: the env process in A, attached through `stack_url` `https://A:PORT` (A's own
  address: the kernel carries it over A's loopback device): TLS and the listener's cost alone.
- `link`: the env process in host B, through `stack_url` over the veth link (via the bridge in
  host C): the two-host case.
- `link_delay`: `link` with `tc qdisc ... netem delay D ms` on B's side of the link (D ms more
  round trip), when the kernel has netem; otherwise recorded as unavailable, with tc's error.
Every env process, with its own scripted policy (its own process, on its host's loopback), stays
up for the whole run, so each batch runs on warm processes; `link_delay` uses the `link` one.
Placements are interleaved, their order rotated every repeat; ratios to `local` are taken within
a repeat, then the median. Per batch: rollouts/s, per-rollout latency (p50/p90/p99, from the
rollout's start to its end, waiting for a slot not counted), errors (rollouts not ok, never
retried; a run with errors still writes its file, and says so) and CPU milliseconds per rollout
of every process in hosts A and B (stack, listener, env processes, policies): the two hosts
share the machine's cores, so the link's cost shows as CPU as well as wall time. The file also
has each batch's start time and the stack host's log lines of leases attaching and leaving
(`lease_events`): a lease the host ended mid-run shows there. A stack start that fails is
listed (`start_failures`) and ends the run (`stack up` itself tries again a start Ray's node
timed out).

Writes `benchmarks/results/<date>-link.json` (or `--out`) and prints one line per batch.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import ENV, cpu_s, percentile, spawn_policy, start_child, summary
from benchmarks.netns import DEVICES, A, Hosts, handover

RESULTS = Path(__file__).with_name("results")
PLACEMENTS = ("local", "tls_local", "link", "link_delay")
HOST_OF = {"local": "a", "tls_local": "a", "link": "b", "link_delay": "b"}
"""The host each placement's env process runs in."""
DRIVER_OF = {"local": "local", "tls_local": "tls_local", "link": "link", "link_delay": "link"}
"""The env process each placement runs on (`link_delay` is `link` with netem on)."""
PORT = 8443
BATCH_TIMEOUT_S = 1800.0
FIGURES = ("rollouts_per_s", "p50_ms", "p90_ms", "p99_ms", "cpu_ms_per_rollout")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.link", description=__doc__)
    parser.add_argument("--rollouts", type=int, default=500, help="rollouts per batch")
    parser.add_argument(
        "--in-flight", type=int, action="append", help="rollouts in flight (repeatable)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--placement", action="append", choices=PLACEMENTS)
    parser.add_argument("--delay-ms", type=float, default=1.0, help="link_delay's netem delay")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.in_flight = args.in_flight or [64, 256]
    args.placement = list(dict.fromkeys(args.placement or PLACEMENTS))
    if args.driver:
        return args
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if min(args.in_flight) < 1:
        parser.error("--in-flight must be at least 1")
    if args.rollouts < max(args.in_flight):
        parser.error(f"--rollouts {args.rollouts} is fewer than --in-flight {max(args.in_flight)}")
    if "local" not in args.placement:
        parser.error("the placements need `local`: every ratio is to it")
    if args.delay_ms <= 0:
        parser.error("--delay-ms must be positive")
    return args


def order(placements: list[str], repeat: int) -> list[str]:
    """`placements` rotated by `repeat` (each one leads in turn)."""
    shift = repeat % len(placements)
    return placements[shift:] + placements[:shift]


def batch_figures(seconds: float, latencies: list[float], cpu: float, n: int) -> dict[str, float]:
    """A batch's figures: `n` rollouts in `seconds`, each rollout's `latencies` (s), `cpu`
    seconds used by the hosts' processes."""
    return {
        "rollouts_per_s": n / seconds,
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p90_ms": percentile(latencies, 0.9) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "cpu_ms_per_rollout": cpu * 1000 / n,
    }


def summarize(
    batches: list[dict[str, Any]], placements: list[str], in_flights: list[int]
) -> dict[str, Any]:
    """Per in-flight level and placement, the summary (median, min, max, values) of each of
    FIGURES over the repeats; and per placement the ratio of its rollouts/s to `local`'s
    (`rate_vs_local`) and of its p50 (`p50_vs_local`), taken within each repeat."""
    out: dict[str, Any] = {}
    for k in in_flights:
        level: dict[str, Any] = {}
        rows = {p: [b for b in batches if b["in_flight"] == k and b["placement"] == p]
                for p in placements}  # fmt: skip
        for p in placements:
            level[p] = {f: summary([b[f] for b in rows[p]]) for f in FIGURES}
            level[p]["errors"] = sum(b["errors"] for b in rows[p])
        local = {b["repeat"]: b for b in rows["local"]}
        for p in placements:
            if p == "local":
                continue
            pairs = [(b, local[b["repeat"]]) for b in rows[p] if b["repeat"] in local]
            level[p]["rate_vs_local"] = summary(
                [b["rollouts_per_s"] / a["rollouts_per_s"] for b, a in pairs]
            )
            level[p]["p50_vs_local"] = summary([b["p50_ms"] / a["p50_ms"] for b, a in pairs])
        out[str(k)] = level
    return out


def table(figures: dict[str, Any]) -> list[str]:
    """The markdown table of `summarize`'s `figures` that docs/performance.md quotes: per in-flight
    level and placement, the medians (rates to 0.1/s, ratios to 0.01, latencies to 1 ms, CPU to
    0.1 ms; min..max over the repeats for the rates and ratios) and the errors."""

    def spread(f: dict[str, Any], digits: int, unit: str = "") -> str:
        return f"{f['median']:.{digits}f}{unit} ({f['min']:.{digits}f}..{f['max']:.{digits}f})"

    lines = [
        "| in flight | placement | rollouts/s | vs `local` | p50 / p99 latency | "
        "CPU per rollout | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for k, level in figures.items():
        for placement, f in level.items():
            ratio = spread(f["rate_vs_local"], 2, "x") if "rate_vs_local" in f else "1x"
            latency = f"{f['p50_ms']['median']:.0f} / {f['p99_ms']['median']:.0f} ms"
            cpu = f"{f['cpu_ms_per_rollout']['median']:.1f} ms"
            rate = spread(f["rollouts_per_s"], 1)
            lines.append(
                f"| {k} | `{placement}` | {rate} | {ratio} | {latency} | {cpu} | {f['errors']} |"
            )
    return lines


# --- an env process (`--driver`), in its host ----------------------------------------------


def emit(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


async def drive(spec: dict[str, Any]) -> None:
    """One env process: its scripted policy, the env attached as `spec["taskset"]` says; then
    one batch per stdin line `{"n": N, "in_flight": K}`, answered with one JSON line (seconds,
    latencies, errors), until a line without "n" or the end of stdin."""
    import verifiers.v1 as vf
    from verifiers.v1.configs.client import EvalClientConfig

    import nemo_gym_env

    os.environ.setdefault("SCRIPTED_KEY", "unused")
    async with await spawn_policy() as policy:
        env: Any = nemo_gym_env.load_environment(nemo_env=ENV, **spec["taskset"])
        tasks = list(env.taskset)
        client = EvalClientConfig(base_url=policy.info["base_url"], api_key_var="SCRIPTED_KEY")
        ctx = vf.ModelContext(model="scripted", client=client)
        async with env.serving():
            if env.start_error is not None:
                emit({"error": str(env.start_error)})
                return
            emit({"ready": os.getpid(), "policy": policy.pid})
            loop = asyncio.get_running_loop()
            while (line := await loop.run_in_executor(None, sys.stdin.readline)) and (
                "n" in (command := json.loads(line))
            ):
                emit(await batch(env, tasks, ctx, command["n"], command["in_flight"]))


async def batch(env: Any, tasks: list[Any], ctx: Any, n: int, in_flight: int) -> dict[str, Any]:
    """`n` rollouts, `in_flight` at a time: wall seconds, each rollout's seconds (in finishing
    order), how many were not ok (or not reward 1.0, which the scripted policy always earns)
    and the first one's error."""
    gate = asyncio.Semaphore(in_flight)
    latencies: list[float] = []
    failed: list[str] = []

    async def one(i: int) -> None:
        async with gate:
            began = time.perf_counter()
            episode = await env.run_episode(tasks[i % len(tasks)], ctx)
            latencies.append(time.perf_counter() - began)
            rewards = [t.reward for t in episode.traces]
            if not episode.ok or rewards != [1.0]:
                errors = [e.message for e in episode.errors]
                errors += [e.message for t in episode.traces for e in t.errors]
                text = f"ok={episode.ok} rewards={rewards} {errors[:1]}"
                # Nested agent errors put their cause last: keep both ends.
                failed.append(text if len(text) <= 1200 else f"{text[:400]} ... {text[-800:]}")

    began = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    seconds = time.perf_counter() - began
    return {"seconds": seconds, "latencies": latencies, "errors": len(failed),
            "first_error": failed[0] if failed else None}  # fmt: skip


# --- the run, as root --------------------------------------------------------------------


class Driver:
    """An env process (`--driver`) in a host: batches asked on its stdin, answered on stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, hosts: Hosts, host: str, spec: dict[str, Any], log: Path) -> Driver:
        with log.open("wb") as stderr:
            proc = await start_child(
                *hosts.run(host), sys.executable, "-m", "benchmarks.link", "--driver",
                json.dumps(spec), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
            )  # fmt: skip
        driver = cls(proc)
        ready = await driver.answer(600)
        if "ready" not in ready:
            await driver.stop()
            raise RuntimeError(f"the env process in host {host.upper()} did not start: {ready}")
        return driver

    async def answer(self, seconds: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), seconds)
        if not line:
            raise RuntimeError(f"the env process exited ({await self.proc.wait()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def batch(self, n: int, in_flight: int) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"n": n, "in_flight": in_flight}).encode() + b"\n")
        await self.proc.stdin.drain()
        return await self.answer(BATCH_TIMEOUT_S)

    async def stop(self) -> None:
        """Ask it to end (it releases its lease and stops its policy); killed after 120 s."""
        if self.proc.returncode is None:
            assert self.proc.stdin is not None
            with contextlib.suppress(ConnectionError):
                self.proc.stdin.write(b"{}\n")
                self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 120)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


def netem(hosts: Hosts, on: bool, delay_ms: float) -> str | None:
    """Add (`on`) or remove netem's delay on B's side of the link; tc's error, or None."""
    verb = ["add", "dev", DEVICES["b"], "root", "netem", "delay", f"{delay_ms}ms"] if on else [
        "del", "dev", DEVICES["b"], "root"]  # fmt: skip
    done = subprocess.run(
        [*hosts.run("b"), "tc", "qdisc", *verb], capture_output=True, text=True
    )  # fmt: skip
    return None if done.returncode == 0 else (done.stderr or done.stdout).strip()[:300]


async def _stack(program: str, args: list[str], env: dict[str, str]) -> Any:
    """`program args...` (a `nemo-gym-env stack` command line) run to its end, output captured."""
    return await asyncio.to_thread(
        subprocess.run, [program, *args], env=env, capture_output=True, text=True, timeout=1800
    )


def hosts_cpu_s(hosts: Hosts) -> float:
    """CPU seconds used so far by every process now in hosts A and B."""
    pids = [pid for host in "ab" for pid in hosts.pids().get(host, [])]
    return sum(cpu_s(pid) or 0.0 for pid in pids)


async def run(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """The run (see the module doc); fills `result` as it goes."""
    from benchmarks.common import bench_runtime
    from verifiers_nemogym.errors import StackError
    from verifiers_nemogym.nemo.catalog import Catalog
    from verifiers_nemogym.shared import client, protocol

    runtime = bench_runtime()
    result["nemo_gym_version"] = runtime.nemo_gym_version
    directory = client.stack_dir(client.stack_key(runtime, Catalog(runtime).env(ENV).config_paths))
    try:
        await protocol.status(directory, timeout=10)
    except StackError:
        pass  # none runs: the one in host A will be the only one
    else:  # it would be attached to instead, and its loopback is not A's
        raise RuntimeError(f"a shared stack of {ENV} already runs here: `stack down` it first")
    cli = str(Path(sys.executable).with_name("nemo-gym-env"))
    env = {**os.environ, "SCRIPTED_KEY": "unused"}
    hosts = Hosts(f"vfnl{uuid.uuid4().hex[:6]}")
    result["start_failures"] = []
    drivers: dict[str, Driver] = {}
    up = False
    placements = list(args.placement)
    try:
        hosts.create()
        if "link_delay" in placements:
            if (error := netem(hosts, True, args.delay_ms)) is None:
                netem(hosts, False, args.delay_ms)
            result["netem"] = {"device": f"{DEVICES['b']} (host B's side)",
                               "delay_ms": args.delay_ms, "unavailable": error}  # fmt: skip
            if error is not None:
                placements.remove("link_delay")
                print(f"link_delay left out: tc netem: {error}", file=sys.stderr)
        result["placements_run"] = placements
        listen = [*hosts.run("a"), cli, "stack", "up", ENV, "--listen", f"{A}:{PORT}",
                  "--idle-timeout", "1800"]  # fmt: skip
        # The hosts have no route out, and a start that finds NeMo Gym's server venvs not known
        # good (first start, or after a failed one) installs from the package index: one start
        # here, where the index is reachable, makes them good first. A start Ray's node timed
        # out (load) is tried again by `stack up` itself (`nemo.stack.start_stack`).
        began = time.monotonic()
        given = failed = None
        for verb in ("up", "down"):
            done = await _stack(cli, ["stack", verb, ENV], env)
            if done.returncode != 0:
                failed = f"stack {verb}: {(done.stdout + done.stderr)[-1500:]}"
                break
        result["prepare_s"] = time.monotonic() - began
        if failed is None:
            began = time.monotonic()
            done = await _stack(listen[0], listen[1:], env)
            up = done.returncode == 0
            if up and (given := handover(done.stdout + done.stderr)):
                result["stack_up_s"] = time.monotonic() - began
            else:
                failed = f"stack up --listen: {(done.stdout + done.stderr)[-1500:]}"
        if given is None:
            result["start_failures"].append(failed)
            raise RuntimeError(f"the stack did not start in host A: {failed}")
        with tempfile.TemporaryDirectory(prefix="bench-link-") as tmp:
            token = Path(tmp, "stack-token")  # the copy an env host is handed, 0600
            shutil.copyfile(given.token_file, token)
            token.chmod(0o600)
            remote = {"stack_url": given.url, "stack_pin": given.pin,
                      "stack_token_file": str(token)}  # fmt: skip
            specs = {"local": {}, "tls_local": remote, "link": remote}
            for name in dict.fromkeys(DRIVER_OF[p] for p in placements):
                log = Path(tmp, f"{name}.log")
                try:
                    drivers[name] = await Driver.start(
                        hosts, HOST_OF[name], {"taskset": specs[name]}, log
                    )
                except Exception:
                    print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
                    raise
            for name, driver in drivers.items():  # warm-up: connections, imports, Ray workers
                warm = await driver.batch(max(args.in_flight), max(args.in_flight))
                print(f"warm-up {name}: {warm['seconds']:.1f} s, {warm['errors']} errors")
            batches: list[dict[str, Any]] = result["batches"]
            for r in range(args.repeats):
                for k in args.in_flight:
                    for placement in order(placements, r):
                        delayed = placement == "link_delay"
                        if delayed and (error := netem(hosts, True, args.delay_ms)):
                            raise RuntimeError(f"tc netem: {error}")
                        began_at = datetime.datetime.now().isoformat(timespec="seconds")
                        try:
                            cpu_before = hosts_cpu_s(hosts)
                            answer = await drivers[DRIVER_OF[placement]].batch(args.rollouts, k)
                            cpu = hosts_cpu_s(hosts) - cpu_before
                        finally:
                            if delayed:
                                netem(hosts, False, args.delay_ms)
                        figures = batch_figures(
                            answer["seconds"], answer["latencies"], cpu, args.rollouts
                        )
                        row = {"repeat": r, "in_flight": k, "placement": placement,
                               "began_at": began_at,
                               **figures, "errors": answer["errors"],
                               "first_error": answer["first_error"],
                               "load_average": os.getloadavg()}  # fmt: skip
                        batches.append(row)
                        print(json.dumps({f: v for f, v in row.items() if f != "first_error"}))
            for driver in drivers.values():
                await driver.stop()
    finally:
        for driver in drivers.values():
            await driver.stop()
        with contextlib.suppress(OSError):  # when leases came and went, to set beside batches
            log = (directory / protocol.LOG).read_text(errors="replace").splitlines()
            result["lease_events"] = [line for line in log if "remote user pid" in line]
        if up:
            subprocess.run([cli, "stack", "down", ENV], env=env, capture_output=True, timeout=300)
        began = time.monotonic()
        while any(hosts.pids().values()) and time.monotonic() - began < 60:
            await asyncio.sleep(0.5)
        result["left_in_hosts"] = {h: len(p) for h, p in hosts.pids().items()}
        hosts.destroy()


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.driver:
        asyncio.run(drive(json.loads(args.driver)))
        return
    if os.geteuid() != 0:
        sys.exit("python -m benchmarks.link needs root: its hosts are network namespaces")
    day = datetime.date.today().isoformat()
    result: dict[str, Any] = {
        "date": day,
        "command": "python -m benchmarks.link " + " ".join(sys.argv[1:]),
        "environment": ENV,
        "cpus": os.cpu_count(),
        "rollouts": args.rollouts,
        "in_flight": args.in_flight,
        "repeats": args.repeats,
        "placements": {
            "local": "env process in host A, attached to A's stack locally (loopback, unix socket)",
            "tls_local": "env process in host A, stack_url https://A:PORT (TLS over A's loopback)",
            "link": "env process in host B, stack_url https://A:PORT over the veth link",
            "link_delay": f"link with netem delay {args.delay_ms} ms on B's side of the link",
        },
        "load_average_start": os.getloadavg(),
        "batches": [],
    }
    asyncio.run(run(args, result))
    result["load_average_end"] = os.getloadavg()
    result["figures"] = summarize(result["batches"], result["placements_run"], args.in_flight)
    result["errors"] = sum(b["errors"] for b in result["batches"])
    path = args.out or RESULTS / f"{day}-link.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(table(result["figures"])))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
