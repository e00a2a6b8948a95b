"""NeMo Gym's aggregate metrics of recorded rollouts, computed by NeMo Gym itself.

This module sends the request NeMo Gym's own eval sends once its rollouts are done (each agent's
results POSTed to `/aggregate_metrics`), built from the traces, to the same endpoint of a running
stack, or computes the default aggregate without one: the numbers are NeMo Gym's code's, not a
reimplementation. Which runs a path holds, which rollouts are aggregated and with what indices:
docs/metrics.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import json
import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pydantic_core
import zstandard

from verifiers_nemogym.bridge.redact import cut
from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.nemo.answers import read_json_answer
from verifiers_nemogym.nemo.release import features

logger = logging.getLogger(__name__)

METRICS_FILE = "nemo_gym_aggregate_metrics.json"
"""Written beside a vf-eval run's `traces.jsonl` (the name NeMo Gym's collector would give the
output `nemo_gym.jsonl`)."""
TRACES_FILE = "traces.jsonl"
TASK_INDEX = "_ng_task_index"
ROLLOUT_INDEX = "_ng_rollout_index"


@dataclass
class Rollouts:
    """What `collect` found: per agent, the stripped results NeMo Gym aggregates."""

    by_agent: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    failed: int = 0
    """Rollouts left out: errors, as NeMo Gym leaves its failed rollouts out."""
    runtime: dict[str, Any] | None = None
    """The NeMo Gym release and Python the rollouts ran on (`trace.info["nemo_gym_runtime"]`)."""
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    """A recorded row of each agent (what starting a stack for it needs)."""


def stream_files(folder: Path) -> list[Path]:
    """prime-rl's trace chunks in a folder: `*.jsonl` and `*.jsonl.zst`, in name order."""
    return sorted(
        p for p in folder.iterdir() if p.is_file() and p.name.endswith((".jsonl", ".jsonl.zst"))
    )


def trace_files(path: Path) -> list[Path]:
    """The trace files `path` names: a `traces.jsonl` (or any `.jsonl` / `.jsonl.zst` file), a
    vf-eval run folder holding `traces.jsonl`, or a folder of trace chunks (prime-rl's
    `monitors/file/traces/stream/`, or an output folder above it)."""
    path = path.expanduser()
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ConfigError(f"no such file or folder: {path}")
    if (path / TRACES_FILE).is_file():
        return [path / TRACES_FILE]
    for folder in (path, path / "monitors/file/traces/stream"):
        if folder.is_dir() and (found := stream_files(folder)):
            return found
    streams = sorted(path.glob("**/monitors/file/traces/stream"))
    if len(streams) == 1 and (found := stream_files(streams[0])):
        return found
    raise ConfigError(
        f"{path}: no traces here (a vf-eval output folder or run folder with {TRACES_FILE}, a "
        "traces file, or prime-rl's monitors/file/traces/stream/ folder of *.jsonl[.zst] chunks)"
    )


def runs(path: Path) -> list[Path]:
    """The runs `path` holds (itself if it is one run, else each run folder under it), each a path
    `read_episodes` reads; a `ConfigError` if there are no traces at all."""
    path = path.expanduser()
    try:
        trace_files(path)
        return [path]
    except ConfigError:
        if not path.is_dir():
            raise
        found = sorted(p.parent for p in path.glob(f"*/{TRACES_FILE}") if p.is_file())
        found += sorted(
            s for s in path.glob("**/monitors/file/traces/stream") if s.is_dir() and stream_files(s)
        )
        if not found:
            raise
        return found


def _lines(path: Path) -> Iterator[bytes]:
    if path.name.endswith(".zst"):
        with path.open("rb") as raw:
            reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
            yield from io.BufferedReader(reader)
        return
    with path.open("rb") as lines:
        yield from lines


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cycle collector off for the block: parsed JSON is acyclic, and as thousands of
    its objects pile up in a large heap (a vf-eval process at its close: 450,000 objects
    after 100 rollouts) the collector scans that heap again and again (278 of the 289 ms it
    took to read 100 traces there)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_episodes(path: Path) -> list[dict[str, Any]]:
    """The episodes (verifiers' `Episode` as JSON) of every trace file `path` names."""
    with _gc_paused():
        return _read_episodes(path)


def _read_episodes(path: Path) -> list[dict[str, Any]]:
    episodes: list[dict[str, Any]] = []
    for file in trace_files(path):
        try:
            for number, line in enumerate(_lines(file), start=1):
                if not line.strip():
                    continue
                try:
                    # pydantic-core's parser: 2-3x json's speed on a trace's long lines
                    episode = pydantic_core.from_json(line)
                except ValueError as e:
                    raise ConfigError(f"{file}:{number}: not a JSON episode ({e})") from None
                if not isinstance(episode, dict) or not isinstance(episode.get("traces"), list):
                    raise ConfigError(f"{file}:{number}: not a verifiers episode (no traces)")
                episodes.append(episode)
        except (OSError, zstandard.ZstdError) as e:  # a truncated or foreign chunk too
            raise ConfigError(f"{file}: cannot be read: {e}") from None
    return episodes


def _task_order(name: str) -> tuple[str, int, str]:
    """`"mcqa/example:12"` -> ("mcqa/example", 12, name): environment, then line."""
    label, _, line = name.rpartition(":")
    return (label, int(line), name) if line.isdigit() else (name, 0, name)


def collect(episodes: Iterable[dict[str, Any]]) -> Rollouts:
    """The rollouts of `episodes` NeMo Gym would aggregate, as its collector strips them, with
    their task and rollout indices; failed rollouts are left out and counted."""
    found = Rollouts()
    kept: list[tuple[str, str, dict[str, Any]]] = []  # (task name, agent, stripped result)
    runtimes: set[str] = set()
    for episode in episodes:
        for trace in episode["traces"]:
            info = trace.get("info") or {}
            result = info.get("nemo_gym")
            data = (trace.get("task") or episode.get("task") or {}).get("data") or {}
            agent = data.get("agent")
            if (
                not episode.get("ok")
                or trace.get("errors")
                or not isinstance(result, dict)
                or not isinstance(agent, str)
            ):
                found.failed += 1
                continue
            if isinstance(runtime := info.get("nemo_gym_runtime"), dict):
                runtimes.add(json.dumps(runtime, sort_keys=True))
                found.runtime = runtime
            name = str(data.get("name") or data.get("id") or data.get("source") or "")
            kept.append((name, agent, dict(result)))
            if isinstance(row := data.get("row"), dict):
                found.rows.setdefault(agent, row)
    if len(runtimes) > 1:
        raise ConfigError(
            f"the traces come from several NeMo Gym runtimes ({', '.join(sorted(runtimes))}); "
            "compute the metrics of one run at a time"
        )
    task_index = {n: i for i, n in enumerate(sorted({n for n, _, _ in kept}, key=_task_order))}
    seen: dict[str, int] = defaultdict(int)
    by_agent: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for name, agent, result in kept:
        result[TASK_INDEX] = task_index[name]
        result[ROLLOUT_INDEX] = seen[name]
        seen[name] += 1
        by_agent[agent].append(result)
    for results in by_agent.values():  # NeMo Gym sorts its results before aggregating
        results.sort(key=lambda r: (r[TASK_INDEX], r[ROLLOUT_INDEX]))
    found.by_agent = dict(sorted(by_agent.items()))
    return found


async def aggregate(
    run_urls: dict[str, str], http: aiohttp.ClientSession, rollouts: Rollouts
) -> list[dict[str, Any]]:
    """NeMo Gym's aggregate metrics of `rollouts`, one entry per agent (as in NeMo Gym's file,
    agents in name order); a `StackError` naming the agent when its stack has no such agent or
    the endpoint fails."""
    entries = []
    for agent, results in rollouts.by_agent.items():
        url = run_urls.get(agent)
        if url is None:
            raise StackError(
                f"agent {agent!r} is not on this NeMo Gym stack "
                f"(agents: {', '.join(sorted(run_urls)) or 'none'})"
            )
        where = f"agent {agent!r} /aggregate_metrics"
        try:
            async with http.post(
                f"{url}/aggregate_metrics", json={"verify_responses": results}
            ) as response:
                text = await response.text()
                status = response.status
        except aiohttp.ClientError as e:
            raise StackError(f"{where} failed: {e!r}") from None
        answer = read_json_answer(where, status, text, StackError)
        entries.append({"agent_ref": {"name": agent}, **answer})
    return entries


def key_metrics_text(entries: list[dict[str, Any]], failed: int) -> str:
    """A few lines for a log or a terminal: each agent's key metrics."""
    lines = []
    for entry in entries:
        metrics = entry.get("key_metrics") or {}
        shown = ", ".join(f"{k} {_number(v)}" for k, v in metrics.items())
        lines.append(f"{entry['agent_ref']['name']}: {shown or 'no key metrics'}")
    if failed:
        lines.append(f"({failed} failed rollout(s) left out, as NeMo Gym leaves them out)")
    return "\n".join(lines)


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def run_folder() -> Path | None:
    """The folder of the vf-eval run this process is, or None (prime-rl's env servers, Python).
    vf-eval tees its run's log to `<run>/logs/attempt_<n>/eval.log` and holds it open for the
    whole run; that open file names the folder (Linux's /proc)."""
    try:
        fds = list(Path("/proc/self/fd").iterdir())
    except OSError:
        return None
    for fd in fds:
        try:
            target = fd.readlink()
        except OSError:  # closed meanwhile (the listing's own descriptor, for one)
            continue
        if target.name == "eval.log" and target.parent.parent.name == "logs":
            folder = target.parent.parent.parent
            if (folder / TRACES_FILE).is_file():
                return folder
    return None


def write_file(folder: Path, entries: list[dict[str, Any]]) -> Path:
    """`entries` as `folder/METRICS_FILE` (what `nemo-gym-env metrics --json` prints)."""
    path = folder / METRICS_FILE
    path.write_text(file_text(entries))
    return path


def file_text(entries: list[dict[str, Any]]) -> str:
    return json.dumps(entries, indent=2) + "\n"


async def write_for_run(run_urls: dict[str, str], http: aiohttp.ClientSession) -> Path | None:
    """In a vf-eval run (`run_folder`), once its rollouts are written and while its stack still
    runs: NeMo Gym's aggregate metrics of the run's traces beside them, key metrics logged.
    Never raises: a run whose metrics cannot be computed keeps its traces (logged warning)."""
    folder = run_folder()
    if folder is None:
        return None
    try:
        rollouts = collect(read_episodes(folder / TRACES_FILE))
        if not rollouts.by_agent:
            logger.warning("NeMo Gym aggregate metrics: no successful rollout in %s", folder)
            return None
        path = write_file(folder, await aggregate(run_urls, http, rollouts))
    except Exception as e:  # the run's results are on disk whatever happens here
        logger.warning("NeMo Gym aggregate metrics not computed: %s", cut(str(e), 2000))
        return None
    entries = json.loads(path.read_text())
    logger.info(
        "NeMo Gym aggregate metrics (%s):\n%s", path, key_metrics_text(entries, rollouts.failed)
    )
    return path


def prepare(path: Path) -> Rollouts:
    """The rollouts of the one run at `path` to aggregate; ConfigError when there is none."""
    rollouts = collect(read_episodes(path))
    if not rollouts.by_agent:
        raise ConfigError(f"{path}: no successful NeMo Gym rollout to aggregate")
    return rollouts


async def compute(
    rollouts: Rollouts,
    *,
    judge: dict[str, Any] | None = None,
    nemo_gym_version: str | None = None,
    python: str | None = None,
) -> list[dict[str, Any]]:
    """NeMo Gym's aggregate metrics of `rollouts` (`prepare`), on the release and Python they
    ran on (unless `nemo_gym_version` / `python` say otherwise): without a stack for agents
    that keep NeMo Gym's default (`default_aggregates`), else on a private stack of just their
    configs, started, asked and stopped (docs/metrics.md). A judge environment's stack needs its
    `judge`, though no judge is called. ConfigError / StackError name what is wrong."""
    from verifiers_nemogym.nemo.venv import ensure_venv

    runtime = rollouts.runtime or {}
    version = nemo_gym_version or runtime.get("nemo_gym")
    venv = await asyncio.to_thread(
        ensure_venv,
        version,
        python or runtime.get("python"),
        allow_below_floor=bool(runtime.get("below_floor")) or None,
    )
    answers = await default_aggregates(venv, rollouts)
    rest = [agent for agent in rollouts.by_agent if agent not in answers]
    if rest:
        stacked = Rollouts(
            by_agent={a: rollouts.by_agent[a] for a in rest},
            runtime=rollouts.runtime,
            rows={a: rollouts.rows[a] for a in rest if a in rollouts.rows},
        )
        for entry in await _compute_on_stack(
            stacked, judge=judge, version=venv.nemo_gym_version, python=str(venv.python),
            below_floor=venv.below_floor,
        ):  # fmt: skip
            answers[entry["agent_ref"]["name"]] = entry
    return [answers[agent] for agent in rollouts.by_agent]


_PROBE = Path(__file__).with_name("nemo") / "aggregate_probe.py"


async def default_aggregates(venv: Any, rollouts: Rollouts) -> dict[str, dict[str, Any]]:
    """The entries (as `aggregate` gives them) of the agents of `rollouts` whose
    `/aggregate_metrics` answer is NeMo Gym's default (its class overrides no aggregate hook, its
    config does not skip verification), computed by the runtime's own code
    (`nemo/aggregate_probe.py`) without starting anything; the others are left out, said why in
    the log, for a stack to answer."""
    from verifiers_nemogym.nemo.catalog import Catalog, load_config, server_blocks

    catalog = Catalog(venv)
    wanted: dict[str, dict[str, Any]] = {}
    why: dict[str, str] = {}
    for agent, results in rollouts.by_agent.items():
        try:
            spec = catalog.agent_env(agent)
        except ConfigError as e:
            why[agent] = str(e)
            continue
        found = next((a for a in spec.agents if a.name == agent), None)
        if found is None:
            why[agent] = f"its config is not among {spec.name}'s"
            continue
        config = load_config(found.config_path)
        settings = server_blocks(config, "responses_api_agents").get(agent, ("", {}))[1]
        fronts = [
            impl
            for impl, s in server_blocks(config, "environment_servers").values()
            if isinstance(s.get("agent_server"), dict) and s["agent_server"].get("name") == agent
        ]
        if not settings:
            why[agent] = "its settings are not in its config file (merged by NeMo Gym)"
        elif settings.get("skip_verification"):
            why[agent] = "its config skips verification"
        elif any(impl != "legacy_agent" for impl in fronts):
            why[agent] = f"an environment server of its own answers ({', '.join(fronts)})"
        else:
            wanted[agent] = {"impl": found.impl, "verify_responses": results}
    computed: dict[str, Any] = {}
    if wanted:
        proc = await asyncio.create_subprocess_exec(
            str(venv.venv / "bin" / "python"), "-I", str(_PROBE),
            env=venv.env(), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        out, err = await proc.communicate(json.dumps({"agents": wanted}).encode())
        if proc.returncode == 0:
            answer = json.loads(out.decode().strip().splitlines()[-1])
            computed = answer["computed"]
            why.update(answer["not_default"])
        else:  # the stack answers instead; the log says why (the error's last line)
            last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
            why.update(
                dict.fromkeys(wanted, f"the runtime could not compute it ({cut(last, 500)})")
            )
    if computed:
        logger.info(
            "computed NeMo Gym's aggregate of %s without a stack: each keeps NeMo Gym's default "
            "/aggregate_metrics (its class overrides none of the aggregate hooks), run here by "
            "the runtime's own code",
            ", ".join(computed),
        )
    for agent, reason in why.items():
        logger.info("%s needs a stack for its aggregate: %s", agent, reason)
    return {agent: {"agent_ref": {"name": agent}, **entry} for agent, entry in computed.items()}


async def _compute_on_stack(
    rollouts: Rollouts,
    *,
    judge: dict[str, Any] | None,
    version: str,
    python: str,
    below_floor: bool,
) -> list[dict[str, Any]]:
    """`aggregate` on a private stack of just the agents of `rollouts`, started and stopped."""
    import tempfile

    import nemo_gym_env

    agents = list(rollouts.by_agent)
    fronted = features(version).environment_servers
    logger.info(
        "starting a private NeMo Gym %s stack with the configs of %s (the agents, their "
        "resources servers and NeMo Gym's placeholder policy model; no model is called): NeMo "
        "Gym's aggregate metrics are each agent's /aggregate_metrics answer%s, which the agent "
        "computes itself or forwards to its resources server, as its code says",
        version,
        ", ".join(agents),
        " (through the environment server in front of it)" if fronted else "",
    )
    with tempfile.TemporaryDirectory(prefix="vf-nemogym-metrics-") as tmp:
        # One recorded row per agent: the stack then starts exactly those agents' configs.
        rows = Path(tmp) / "rows.jsonl"
        rows.write_text(
            "".join(
                json.dumps({**rollouts.rows[agent], "agent_ref": {"name": agent}}) + "\n"
                for agent in agents
            )
        )
        env = nemo_gym_env.load_environment(
            jsonl_path=str(rows),
            shared_stack=False,
            nemo_gym_version=version,
            python=python,
            allow_python_below_floor=below_floor,
            judge=judge,
        )
        # `start()`/`stop()`, not verifiers' `serving()`: no rollout runs, so no interception.
        await env.start()
        try:
            if env.stack is None:
                raise StackError(f"the NeMo Gym stack did not start: {env.start_error}")
            async with aiohttp.ClientSession() as http:
                return await aggregate(env.stack.run_urls, http, rollouts)
        finally:
            await env.stop()
