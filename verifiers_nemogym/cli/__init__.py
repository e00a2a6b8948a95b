"""`nemo-gym-env`: the project's own commands (evaluation itself is `vf-eval nemo-gym-env`).

nemo-gym-env setup [--nemo-gym-version V] [--python P]   create the NeMo Gym runtime venv
nemo-gym-env list                                         environments the runtime ships
nemo-gym-env conformance [ENV ...] [--json] [--strict]     replay NeMo Gym's recorded rollouts
nemo-gym-env eval-local [ENV] [-n N] [--gguf F] [-- ...]    vf-eval with a local CPU model
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from verifiers_nemogym.errors import NeMoGymError
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.venv import DEFAULT_NEMO_GYM_VERSION, ensure_venv


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
    local = commands.add_parser(
        "eval-local", help="vf-eval with a local CPU model, no API key (after --: vf-eval args)"
    )
    local.add_argument("env", nargs="?", default="example_single_tool_call", metavar="ENV")
    local.add_argument("-n", type=int, default=3, help="rows to evaluate (default 3)")
    local.add_argument("-r", type=int, default=1, help="rollouts per row (default 1)")
    local.add_argument("-c", type=int, default=2, help="rollouts at once (default 2)")
    local.add_argument("--max-turns", type=int, default=4, help="model calls per rollout")
    local.add_argument("--gguf", type=Path, default=None, help="a GGUF model file of your own")
    local.add_argument(
        "--chat-template", default="fenced-json", help="fenced-json (default), model, or a file"
    )
    local.add_argument("-o", "--output-dir", type=Path, default=Path("outputs"))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # eval-local passes everything after `--` to vf-eval untouched.
    passthrough = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        runtime = ensure_venv(args.nemo_gym_version, args.python)
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
        elif args.command == "eval-local":
            from verifiers_nemogym.cli.local_eval import LocalEvalOptions, run_local_eval
            from verifiers_nemogym.policies.local_model import chat_template_choice

            return run_local_eval(
                LocalEvalOptions(
                    nemo_env=args.env,
                    num_tasks=args.n,
                    rollouts=args.r,
                    concurrency=args.c,
                    max_turns=args.max_turns,
                    gguf=args.gguf,
                    chat_template=chat_template_choice(args.chat_template),
                    output_dir=args.output_dir,
                    nemo_gym_version=args.nemo_gym_version,
                    python=args.python,
                    vf_eval_args=passthrough,
                )
            )
    except NeMoGymError as e:
        print(f"nemo-gym-env: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
