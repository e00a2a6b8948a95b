"""The per-release conformance tables, kept as data in `tables.toml` (what was verified to run
offline, judge-replay lists, known reasons, rescored recordings, the harness and container
surveys), and what `nemo-gym-env list` says of an environment from them (`offline_status`,
`runs_here`)."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from verifiers_nemogym.nemo.catalog import ENVIRONMENTS
from verifiers_nemogym.nemo.release import DEFAULT_NEMO_GYM_VERSION, release_row

T = TypeVar("T")
_RELEASES = tomllib.loads((Path(__file__).with_name("tables.toml")).read_text(encoding="utf-8"))
# The release tables live as data in tables.toml (what runs offline, known reasons,
# rescored recordings); these names read them.
CI_ENVS: tuple[str, ...] = tuple(_RELEASES["ci_envs"])
"""The fixed subset CI checks for exact parity."""
VERIFIED_OFFLINE: dict[str, tuple[str, ...]] = {
    release: tuple(envs) for release, envs in _RELEASES["verified_offline"].items()
}
"""Release -> the environments conformance runs verified to run offline here."""
KNOWN_REASONS: dict[str, str] = dict(_RELEASES["known_reasons"])
"""Environment -> why its replayed reward may differ from the recording (found by runs)."""
RESCORED: dict[str, dict[str, tuple[float, str]]] = {
    release: {rec: (float(v["reward"]), str(v["why"])) for rec, v in recs.items()}
    for release, recs in _RELEASES["rescored"].items()
}
"""Release -> recording -> (the reward that release's own verifier gives it, why)."""
NOT_OFFLINE: dict[str, str] = dict(_RELEASES["not_offline"])
"""Environments that do not run offline for a reason their config does not show."""
JUDGE_REPLAY: dict[str, tuple[str, ...]] = {
    release: tuple(envs) for release, envs in _RELEASES["judge_replay"].items()
}
"""Release -> the LLM-judge environments whose recordings keep the judge's output: what
`nemo-gym-env conformance --judge-envs` replays, policy and judge (docs/conformance.md)."""


def _serving(table: Mapping[str, T], release: str) -> tuple[str, T | None]:
    """The row of `table` that serves `release` (`release.release_row`'s rule) with its key;
    `(release, None)` when no row does."""
    row = release_row(table, release)
    if row is None:
        return release, None
    return row


def default_envs(release: str) -> tuple[str, ...]:
    """What `nemo-gym-env conformance` runs without names on `release`: the verified list that
    serves it."""
    return _serving(VERIFIED_OFFLINE, release)[1] or ()


def rescored_on(release: str) -> dict[str, tuple[float, str]]:
    """The `RESCORED` recordings that serve `release`: recording -> (reward, why)."""
    return _serving(RESCORED, release)[1] or {}


def judge_envs(release: str) -> tuple[str, ...]:
    """What `nemo-gym-env conformance --judge-envs` runs on `release`: the `JUDGE_REPLAY` list
    that serves it."""
    return _serving(JUDGE_REPLAY, release)[1] or ()


JUDGE_SURVEY: dict[str, dict[str, tuple[int, int, int]]] = {
    release: {env: (int(r), int(c), int(e)) for env, (r, c, e) in envs.items()}
    for release, envs in _RELEASES["judge_survey"].items()
}
"""Release -> LLM-judge environment -> (rows, completed, exact) of the judge conformance survey
(`conformance --judge-envs`, the replay judge named through --env.taskset.judge.*)."""
WITH_JUDGE = "yes, with --env.taskset.judge.*"
"""`nemo-gym-env list`'s "runs here" for a judge environment the judge survey ran."""


def runs_here(
    name: str, problem: str | None, facts: dict[str, str], release: str = DEFAULT_NEMO_GYM_VERSION
) -> tuple[str, str]:
    """`nemo-gym-env list`'s "runs here" and "why": `offline_status` as yes/no, except that an
    LLM-judge environment whose rows completed in the judge conformance survey that serves
    `release` (named) is `WITH_JUDGE`, and one whose rows did not is no, with the counts."""
    offline, why = offline_status(name, problem, facts, release)
    if offline or problem:
        return ("yes" if offline else "no"), why
    source, survey = _serving(JUDGE_SURVEY, release)
    surveyed = (survey or {}).get(name)
    if surveyed is None:
        return "no", why
    rows, completed, exact = surveyed
    counts = (
        f"judge conformance survey (NeMo Gym {source}, the replay judge): {completed}/{rows} "
        f"rows completed, {exact} with the recorded reward"
    )
    if completed == 0:
        return "no", f"{counts}; {KNOWN_REASONS.get(name, why)}"
    return WITH_JUDGE, f"ran with a judge named by --env.taskset.judge.*: {counts}"


HARNESSES: dict[str, dict[str, dict[str, str]]] = _RELEASES["harnesses"]
"""Release -> coding-agent harness environment -> `ran` (date of the run here) and `overrides`,
or `why` it does not run here (tables.toml)."""
CONTAINERS: dict[str, dict[str, dict[str, str]]] = _RELEASES["containers"]
"""Release -> container environment -> `ran` (date of the run here with hand-made tasks), the
agent `pairing` and what it `needs`, the other sandbox `providers` it ran through, or `why` it
does not run here (tables.toml)."""


def offline_status(
    name: str, problem: str | None, facts: dict[str, str], release: str = DEFAULT_NEMO_GYM_VERSION
) -> tuple[bool, str]:
    """Whether the catalog entry `name` (bare folder name, or `environments/<name>` where both
    layouts have it) of NeMo Gym `release` ran here (offline, on a CPU machine), and why: True
    only for what was run (conformance runs, `default_envs(release)`; the harness survey,
    `HARNESSES`); otherwise the reason known (`NOT_OFFLINE`, the survey) or shown by the entry's
    `facts` (`CatalogEntry.facts`: judge model, API key, sandbox, URL requirement, a coding-agent
    harness), or that it has not been run here. Container environments (`CONTAINERS`) come first:
    their configs define no agent; NeMo Gym pairs them with one (`pairing`)."""
    source, containers = _serving(CONTAINERS, release)
    if (container := (containers or {}).get(name)) is not None:
        if "ran" not in container:
            return False, container["why"]
        also = f"; also ran through {container['providers']}" if "providers" in container else ""
        return True, (
            f"ran here with --env.taskset.config-paths {container['pairing']} and the docker "
            f"provider config (container survey, NeMo Gym {source}, {container['ran']}); "
            f"needs {container['needs']}{also}"
        )
    if problem:
        return False, problem
    source, verified = _serving(VERIFIED_OFFLINE, release)
    if name in (verified or ()) or f"{ENVIRONMENTS}/{name}" in (verified or ()):
        return True, f"verified by conformance runs (NeMo Gym {source})"
    source, harnesses = _serving(HARNESSES, release)
    if (surveyed := (harnesses or {}).get(name)) is not None:
        if "ran" not in surveyed:
            return False, surveyed["why"]
        needs = f"; needs {surveyed['overrides']}" if "overrides" in surveyed else ""
        return True, f"ran here (harness survey, NeMo Gym {source}, {surveyed['ran']}{needs})"
    if name in NOT_OFFLINE:
        return False, NOT_OFFLINE[name]
    for key in ("harness", "judge", "api_key", "sandbox", "url_requirement"):
        if key in facts:
            return False, facts[key]
    return False, "not run here yet (its files show no judge, key, sandbox or URL requirement)"
