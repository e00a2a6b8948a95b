"""The reward range of each agent of a stack: what NeMo Gym's own manifests declare, or the user's.

NeMo Gym (0.7+) ships a `manifest.yaml` per benchmark and environment (`benchmarks/**/`,
`environments/**/`) whose `reward.range` is the inclusive `[lower, upper]` its verifier's rewards
fall in (NeMo Gym's onboarding checks its verifier fixtures against it), with the
`resources_server` and `agent_server` it runs. Earlier releases ship none. A reward outside its
range is no measurement, and the harness makes such a rollout an error (docs/reliability.md).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from verifiers_nemogym.nemo.catalog import AGENTS, RESOURCES_SERVERS, server_blocks

MANIFEST_ROOTS = ("benchmarks", "environments")
"""Folders of NeMo Gym's install holding its `manifest.yaml` files."""
OPTION = "--env.taskset.reward-range"
GRADER_RANGES: dict[str, tuple[float, float, str, str]] = {
    "swe_next": (0.0, 1.0, "resources_servers/swe_next/app.py",
                 '"reward": 1.0 if result.resolved else 0.0'),
}  # fmt: skip
"""Resources server folder -> (low, high, its file, the line that gives the reward) for pass/fail
graders NeMo Gym ships no manifest for (read from NeMo Gym 0.7.0's code). Used only when the
installed file still has that line, once, and no manifest covers the agent."""


@dataclass(frozen=True)
class RewardRange:
    """An inclusive reward range and who stated it."""

    low: float
    high: float
    source: str
    """`OPTION`, or the NeMo Gym manifests (paths relative to its install) that declare it."""

    def holds(self, reward: float) -> bool:
        return self.low <= reward <= self.high

    def describe(self) -> str:
        return f"[{self.low:g}, {self.high:g}] ({self.source})"

    def info(self) -> dict[str, Any]:
        """What a trace records of it (`trace.info["nemo_gym_reward_range"]`)."""
        return {"range": [self.low, self.high], "source": self.source}


def check_range(value: Sequence[Any]) -> tuple[float, float]:
    """`value` as `(low, high)`: ValueError (one line) unless two finite numbers, low <= high."""
    if len(value) != 2:
        raise ValueError(f"{OPTION} takes two numbers [low, high], got {len(value)}")
    low, high = (float(v) for v in value)
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        raise ValueError(f"{OPTION} takes finite numbers with low <= high, got [{low}, {high}]")
    return low, high


@dataclass(frozen=True)
class _Declared:
    path: str
    resources_server: str
    agent_server: str | None
    low: float
    high: float


def _manifests(install: Path, servers: Collection[str]) -> list[_Declared]:
    """Every manifest of NeMo Gym's install at `install` (its site-packages) that names one of
    `servers` as its resources server and declares a finite, ordered reward range; others are
    skipped, and only those whose text holds one of the names are parsed at all."""
    found = []
    for root in MANIFEST_ROOTS:
        for path in sorted((install / root).rglob("manifest.yaml")):
            try:
                text = path.read_text(encoding="utf-8")
                # 0.7.0 ships 174: parsing them all took 0.5-0.9 s of every env start (2 cores).
                if not any(server in text for server in servers):
                    continue
                manifest = yaml.safe_load(text)
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                continue
            if not isinstance(manifest, dict):
                continue
            reward = manifest.get("reward")
            bounds = reward.get("range") if isinstance(reward, dict) else None
            server = manifest.get("resources_server")
            agent = manifest.get("agent_server")
            if not isinstance(server, str) or server not in servers:
                continue
            if not isinstance(bounds, list):
                continue
            try:
                low, high = check_range(bounds)
            except (TypeError, ValueError):
                continue
            where = str(path.relative_to(install))
            found.append(_Declared(where, server, agent if isinstance(agent, str) else None,
                                   low, high))  # fmt: skip
    return found


def declared_ranges(install: Path, merged: Iterable[dict[str, Any]]) -> dict[str, RewardRange]:
    """Agent instance of the configs `merged` (each a config's merged mapping) -> the reward
    range NeMo Gym's manifests in `install` declare for it: those naming its resources server's
    folder and its own agent folder, else those naming the resources server alone; where they
    differ, the smallest range holding all of them; for a server no manifest names, the range
    its pass/fail grader gives (`GRADER_RANGES`). Other agents are left out."""
    configs = list(merged)
    resources: dict[str, str] = {}
    for config in configs:
        resources |= {
            name: impl for name, (impl, _) in server_blocks(config, RESOURCES_SERVERS).items()
        }
    manifests = _manifests(install, set(resources.values()))
    ranges: dict[str, RewardRange] = {}
    for config in configs:
        for agent, (impl, settings) in server_blocks(config, AGENTS).items():
            ref = settings.get("resources_server")
            server = resources.get(str(ref.get("name"))) if isinstance(ref, dict) else None
            if server is None:
                continue
            of_server = [m for m in manifests if m.resources_server == server]
            chosen = [m for m in of_server if m.agent_server == impl] or of_server
            if chosen:
                low, high = min(m.low for m in chosen), max(m.high for m in chosen)
                source = "NeMo Gym's " + ", ".join(m.path for m in chosen)
                ranges[agent] = RewardRange(low, high, source)
            elif (graded := _grader_range(install, server)) is not None:
                ranges[agent] = graded
    return ranges


def _grader_range(install: Path, server: str) -> RewardRange | None:
    """`GRADER_RANGES[server]` if the installed grader still gives its reward by that line."""
    if server not in GRADER_RANGES:
        return None
    low, high, path, line = GRADER_RANGES[server]
    try:
        code = (install / path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if code.count(line) != 1:
        return None
    return RewardRange(low, high, f"NeMo Gym's {path} (pass/fail: {line})")
