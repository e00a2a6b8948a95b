"""`nemo-gym-env setup`: create (or show) the cached NeMo Gym runtime venv (docs/runtime.md)."""

from __future__ import annotations

import argparse

from verifiers_nemogym.nemo.venv import ensure_venv


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = commands.add_parser("setup", help="create (or show) the cached NeMo Gym runtime venv")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Make the runtime the global options name; print its release, Python and folder."""
    runtime = ensure_venv(args.nemo_gym_version, args.python)
    print(f"NeMo Gym {runtime.nemo_gym_version} (Python {runtime.python_version}): {runtime.venv}")
    return 0
