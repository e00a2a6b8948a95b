"""`nemo-gym-env conformance [ENV ...]`: replay NeMo Gym's recorded rollouts and compare rewards
(`verifiers_nemogym.conformance`); the table (or JSON) goes to stdout."""

from __future__ import annotations

import argparse
import asyncio
import json

from verifiers_nemogym.nemo.venv import ensure_venv


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "conformance", help="replay NeMo Gym's recorded rollouts, compare rewards"
    )
    parser.set_defaults(func=run)
    parser.add_argument("envs", nargs="*", metavar="ENV", help="default: every offline env")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--strict", action="store_true", help="exit 1 on any reward mismatch")
    parser.add_argument("--concurrency", type=int, default=8, help="rollouts at once")
    parser.add_argument(
        "--judge-envs",
        action="store_true",
        help="without ENV: the LLM-judge environments whose recordings keep the judge's output",
    )
    parser.add_argument(
        "--enable-optional-judges",
        action="store_true",
        help="turn on the judges NeMo Gym ships off (math_with_judge, polymath)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Run, print the table (or JSON) on stdout; exit 1 on parity loss with `--strict`."""
    import nemo_gym_env
    from verifiers_nemogym.conformance.report import format_report
    from verifiers_nemogym.conformance.run import run_in_stacks
    from verifiers_nemogym.conformance.tables import default_envs, judge_envs

    envs = list(args.envs)
    if not envs:  # the release's verified list: which release is the runtime's to say
        release = ensure_venv(args.nemo_gym_version, args.python).nemo_gym_version
        envs = list(judge_envs(release) if args.judge_envs else default_envs(release))
    reports = asyncio.run(
        run_in_stacks(
            envs,
            load_env=nemo_gym_env.load_environment,
            nemo_gym_version=args.nemo_gym_version,
            python=args.python,
            concurrency=args.concurrency,
            enable_optional_judges=args.enable_optional_judges,
        )
    )
    if args.json:
        print(json.dumps([r.to_json() for r in reports], indent=2))
    else:
        print(format_report(reports))
    lost = any(r.start_error or not all(row.parity for row in r.rows) for r in reports)
    return 1 if args.strict and lost else 0
