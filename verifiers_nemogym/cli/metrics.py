"""`nemo-gym-env metrics PATH [--json] [--judge.*]`: NeMo Gym's aggregate metrics of traces.

The path is read (and refused when it holds no traces) before verifiers is imported or anything
is started."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from pathlib import Path

from verifiers_nemogym import metrics
from verifiers_nemogym.cli.arguments import add_judge_arguments, judge_fields
from verifiers_nemogym.errors import ConfigError

logger = logging.getLogger("verifiers_nemogym.cli")


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "metrics",
        help="NeMo Gym's aggregate metrics of a vf-eval run or prime-rl's traces",
    )
    parser.set_defaults(func=run)
    parser.add_argument(
        "path",
        type=Path,
        metavar="PATH",
        help="a vf-eval output folder (-o: each run under it), a run folder, its traces.jsonl, "
        "or prime-rl's monitors/file/traces/stream/",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"print NeMo Gym's whole answer, as vf-eval writes it ({metrics.METRICS_FILE}); "
        "for several runs, one object keyed by run folder",
    )
    add_judge_arguments(parser)  # a judge environment's stack names its judge (none is called)
    return parser


def run(args: argparse.Namespace) -> int:
    """Compute and print: key metrics per agent, or with `--json` the whole file's text; for a
    folder of several runs, each run's, headed by its folder."""
    found = metrics.runs(args.path)
    if len(found) > 1:
        logger.info(
            "%s holds %d runs: computing each run's metrics (%s)",
            args.path, len(found), ", ".join(str(p) for p in found),
        )  # fmt: skip
    elif found[0] != args.path.expanduser():
        logger.info("%s holds one run: %s", args.path, found[0])
    prepared: dict[Path, metrics.Rollouts] = {}
    for path in found:
        try:
            prepared[path] = metrics.prepare(path)
        except ConfigError as e:
            if len(found) == 1:
                raise
            logger.warning("skipped: %s", e)
    if not prepared:
        raise ConfigError(f"{args.path}: no successful NeMo Gym rollout to aggregate in any run")
    results = {
        path: asyncio.run(
            metrics.compute(
                rollouts,
                judge=judge_fields(args),
                nemo_gym_version=args.nemo_gym_version,
                python=args.python,
            )
        )
        for path, rollouts in prepared.items()
    }
    if len(found) == 1:
        (entries,) = results.values()
        (rollouts,) = prepared.values()
        if args.json:
            print(metrics.file_text(entries), end="")
        else:
            print(metrics.key_metrics_text(entries, rollouts.failed))
    elif args.json:
        print(json.dumps({str(p): entries for p, entries in results.items()}, indent=2))
    else:
        print(
            "\n\n".join(
                f"{path}:\n{metrics.key_metrics_text(entries, prepared[path].failed)}"
                for path, entries in results.items()
            )
        )
    return 0
