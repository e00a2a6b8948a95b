"""`nemo-gym-env`: the project's own commands (evaluation itself is `vf-eval nemo-gym-env`).

nemo-gym-env setup [--nemo-gym-version V] [--python P]   create the NeMo Gym runtime venv
nemo-gym-env list                                         environments the runtime ships
nemo-gym-env conformance [ENV ...] [--json] [--strict]     replay NeMo Gym's recorded rollouts
"""

from __future__ import annotations

import argparse
import logging
import sys

from verifiers_nemogym.catalog import Catalog
from verifiers_nemogym.errors import NeMoGymError
from verifiers_nemogym.runtime import DEFAULT_NEMO_GYM_VERSION, ensure_runtime


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nemo-gym-env", description=__doc__.splitlines()[0])
    parser.add_argument("--nemo-gym-version", default=DEFAULT_NEMO_GYM_VERSION)
    parser.add_argument("--python", default=None, help="Python >= 3.12 for NeMo Gym (path/X.Y)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("setup", help="create (or show) the cached NeMo Gym runtime venv")
    commands.add_parser("list", help="list the NeMo Gym environments the runtime ships")
    conf = commands.add_parser(
        "conformance", help="replay NeMo Gym's recorded rollouts, compare rewards"
    )
    conf.add_argument("envs", nargs="*", metavar="ENV", help="default: every offline env")
    conf.add_argument("--json", action="store_true", help="machine-readable output")
    conf.add_argument("--strict", action="store_true", help="exit 1 on any reward mismatch")
    conf.add_argument("--concurrency", type=int, default=8, help="rollouts at once")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        runtime = ensure_runtime(args.nemo_gym_version, args.python)
        if args.command == "setup":
            print(
                f"NeMo Gym {runtime.nemo_gym_version} (Python {runtime.python_version}): "
                f"{runtime.venv}"
            )
        elif args.command == "list":
            print("\n".join(Catalog(runtime).names()))
        elif args.command == "conformance":
            from verifiers_nemogym.conformance import command

            return command(
                args.envs,
                as_json=args.json,
                strict=args.strict,
                nemo_gym_version=args.nemo_gym_version,
                python=args.python,
                concurrency=args.concurrency,
            )
    except NeMoGymError as e:
        print(f"nemo-gym-env: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
