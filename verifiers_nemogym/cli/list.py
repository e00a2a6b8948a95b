"""`nemo-gym-env list [--resolve]`: the environments the runtime's release ships, in both layouts,
with their agents, judge, and whether (and why not) they ran here; then the sandbox providers:
per provider what runs it here, what is tested, what is isolated and how, and what a user on a
cluster must set."""

from __future__ import annotations

import argparse

from verifiers_nemogym.conformance.tables import runs_here
from verifiers_nemogym.containers.providers import provider_table
from verifiers_nemogym.nemo.catalog import (
    ENVIRONMENTS,
    RESOURCES_SERVERS,
    Catalog,
    EnvSpec,
    load_config,
)
from verifiers_nemogym.nemo.judges import judge_need, judge_refs
from verifiers_nemogym.nemo.release import features
from verifiers_nemogym.nemo.venv import NeMoGymVenv, ensure_venv


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = commands.add_parser("list", help="list the NeMo Gym environments the runtime ships")
    parser.set_defaults(func=run)
    parser.add_argument(
        "--resolve",
        action="store_true",
        help="resolve every environment as a run would (NeMo Gym's resolver merges include/"
        "inherit configs: minutes when cold): merged configs' agents, or why one does not resolve",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Print the tables (`list_table`, `providers_table`) of the runtime the global options
    name."""
    runtime = ensure_venv(args.nemo_gym_version, args.python)
    print(list_table(runtime, args.resolve))
    print()
    print(providers_table(runtime))
    return 0


def providers_table(runtime: NeMoGymVenv) -> str:
    """The sandbox providers (`containers.providers.PROVIDER_FACTS`), under a line naming those
    `runtime`'s release ships."""
    shipped = features(runtime.nemo_gym_version).sandbox_providers
    return "\n".join(
        [
            f"sandbox providers NeMo Gym {runtime.nemo_gym_version} ships: "
            f"{', '.join(sorted(shipped)) or 'none'}; any other name is a plug-in's",
            "",
            *provider_table(),
        ]
    )


def list_table(runtime: NeMoGymVenv, resolve: bool = False) -> str:
    """A Markdown table of both layouts: name, layout, agents, judge, runs here (yes: it ran
    here, in conformance runs or the harness survey; "yes, with --env.taskset.judge.*": an
    LLM-judge environment the judge conformance survey ran; no: why not, or not run yet), why.
    With `resolve`, every environment is resolved as a run would resolve it (`Catalog.env`):
    a merged config shows its agents and judge, one that does not resolve says why, and a line
    above the table counts the resolvable ones per layout."""
    catalog = Catalog(runtime)
    found = catalog.resolve_each() if resolve else [(e, None) for e in catalog.entries()]
    lines = [
        f"NeMo Gym {runtime.nemo_gym_version} (Python {runtime.python_version}): "
        f"{len(found)} environments",
        "",
    ]
    if resolve:
        counts = [
            f"{sum(1 for e, s in found if e.layout == layout and isinstance(s, EnvSpec))} of "
            f"{sum(1 for e, _ in found if e.layout == layout)} {layout}"
            for layout in (RESOURCES_SERVERS, ENVIRONMENTS)
        ]
        lines += [f"resolvable: {', '.join(counts)}", ""]
    lines += ["| name | layout | agents | judge | runs here | why |", "|---|---|---|---|---|---|"]
    for entry, spec in found:
        runs, why = runs_here(entry.root.name, entry.problem, entry.facts, runtime.nemo_gym_version)
        agents = ", ".join(entry.agents) or ("(merged by NeMo Gym)" if entry.merged else "-")
        # The file itself (a merged config's judge is known once NeMo Gym merged it).
        judge = judge_need(entry.root.name, judge_refs(load_config(entry.config))) if (
            entry.config and not entry.merged) else "-"  # fmt: skip
        if isinstance(spec, EnvSpec):
            agents = ", ".join(a.name for a in spec.agents)
            merged = catalog.merged_config(spec.config_paths[0])
            judge = judge_need(entry.root.name, judge_refs(merged))
        elif spec is not None and runs != "yes":
            # (A container environment runs with an agent NeMo Gym pairs it with elsewhere: its
            # own config's lack of one is no reason.) Paths inside the release as the release
            # names them, not this machine's.
            reason = str(spec).replace(f"{catalog.root}/", "").replace("|", "\\|")
            agents, runs, why = "-", "no", reason
        lines.append(f"| {entry.name} | {entry.layout} | {agents} | {judge} | {runs} | {why} |")
    return "\n".join(lines)
