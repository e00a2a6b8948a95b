"""`nemo-gym-env`: the project's own commands (evaluation itself is `vf-eval nemo-gym-env`).

nemo-gym-env setup                                        create (or show) the NeMo Gym runtime
nemo-gym-env list [--resolve]                             environments the runtime ships (both
                                                          layouts, which ran here and why not)
nemo-gym-env conformance [ENV ...] [--json] [--strict]     replay NeMo Gym's recorded rollouts
    [--judge-envs] [--enable-optional-judges]             (judge environments: the judge too)
nemo-gym-env eval-local [ENV] [-n N] [--gguf F] [--train] [-- ...]  vf-eval with a local CPU model
nemo-gym-env serve scripted [--port P]                    the scripted model server, alone
nemo-gym-env serve replay (--env ENV | --rollouts F)...   the replay model server, alone
nemo-gym-env serve tokens [--port P] [--model M] [--max-model-len N]  the scripted token server
nemo-gym-env serve answers (--env ENV | --rows F)... [--wrong I,...]  answers rows' questions
nemo-gym-env serve fixer --tasks F... [--wrong I,...]     fixes container tasks as OpenCode's model
nemo-gym-env stack up ENV... [--idle-timeout S] [--judge.*] a persistent shared NeMo Gym stack
    [--listen HOST:PORT]                                  (also for env hosts elsewhere, TLS)
    [--ray-address HOST:PORT]                             (its servers in your Ray cluster)
nemo-gym-env stack status [--json]                        the shared stacks running here
nemo-gym-env stack down [ENV...]                          stop shared stacks (all, or ENV's)
nemo-gym-env metrics PATH [--json] [--judge.*]            NeMo Gym's aggregate metrics of traces
nemo-gym-env make-tasks OUT [--opencode V]                the hand-made container tasks and images
nemo-gym-env options [--markdown]                         the --env.taskset.* options explained

Every command takes the global options first: [--nemo-gym-version V] [--python P]
[--allow-python-below-floor]. Each command is a module with `add_parser` and `run(args) -> exit
status`; `main` only parses and dispatches (docs/architecture.md, "Modules").
"""

from __future__ import annotations

import argparse
import os
import sys

from verifiers_nemogym.cli import (
    conformance,
    eval_local,
    make_tasks,
    metrics,
    options,
    serve,
    setup,
    stack,
)
from verifiers_nemogym.cli import list as list_command  # `list` itself would hide the builtin
from verifiers_nemogym.cli.arguments import UsageError
from verifiers_nemogym.cli.logs import configure_cli_logging
from verifiers_nemogym.errors import NeMoGymError
from verifiers_nemogym.nemo.venv import BELOW_FLOOR_ENV_VAR

COMMANDS = (
    setup, list_command, conformance, eval_local, serve, stack, metrics, make_tasks, options
)  # fmt: skip
"""The command modules, in the order `--help` lists them."""

__all__ = ["COMMANDS", "main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nemo-gym-env", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--nemo-gym-version",
        default=None,
        help="nemo-gym release (default: the newest whose Python floor an interpreter here meets)",
    )
    parser.add_argument("--python", default=None, help="Python for NeMo Gym (path or X.Y)")
    parser.add_argument(
        "--allow-python-below-floor",
        action="store_true",
        help="accept a Python below the release's declared floor (0.5-0.7: >=3.13.14, a "
        f"CPython security floor); same as {BELOW_FLOOR_ENV_VAR}=1",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: the process's), run the command; its exit status, 2 for an error
    the library names (`NeMoGymError`, one line on stderr) or a usage error (argparse's form)."""
    argv = sys.argv[1:] if argv is None else argv
    # eval-local passes everything after `--` to vf-eval untouched.
    passthrough = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = _parser()
    args = parser.parse_args(argv, argparse.Namespace(vf_eval_args=passthrough))
    configure_cli_logging(timestamps=args.command == "conformance")
    if args.allow_python_below_floor:
        # Through the environment, so vf-eval (eval-local) and every library call see it.
        os.environ[BELOW_FLOOR_ENV_VAR] = "1"
    try:
        status: int = args.func(args)
    except UsageError as e:
        parser.error(str(e))  # exits 2, as argparse does
    except NeMoGymError as e:
        print(f"nemo-gym-env: {e}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())
