"""`nemo-gym-env metrics PATH [--json]`: NeMo Gym's aggregate metrics of recorded traces."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from verifiers_nemogym import metrics


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "metrics",
        help="NeMo Gym's aggregate metrics of a vf-eval run or prime-rl's traces",
    )
    parser.add_argument(
        "path",
        type=Path,
        metavar="PATH",
        help="a vf-eval run folder, its traces.jsonl, or prime-rl's monitors/file/traces/stream/",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"print NeMo Gym's whole answer, as vf-eval writes it ({metrics.METRICS_FILE})",
    )
    return parser


def run(args: argparse.Namespace, judge: dict[str, object] | None) -> int:
    """Compute and print: key metrics per agent, or with `--json` the whole file's text."""
    entries, rollouts = asyncio.run(
        metrics.compute(
            args.path,
            judge=judge,
            nemo_gym_version=args.nemo_gym_version,
            python=args.python,
        )
    )
    if args.json:
        print(metrics.file_text(entries), end="")
    else:
        print(metrics.key_metrics_text(entries, rollouts.failed))
    return 0
