"""`nemo-gym-env options [--markdown]`: the `--env.taskset.*` option table
(`verifiers_nemogym.options`; docs/options.md is its Markdown form)."""

from __future__ import annotations

import argparse
import sys


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = commands.add_parser("options", help="the --env.taskset.* options and their meaning")
    parser.set_defaults(func=run)
    parser.add_argument("--markdown", action="store_true", help="as docs/options.md")
    return parser


def run(args: argparse.Namespace) -> int:
    """Write the table to stdout: for a terminal, or with `--markdown` as docs/options.md."""
    from verifiers_nemogym.options import options_markdown, options_text

    sys.stdout.write(options_markdown() if args.markdown else options_text() + "\n")
    return 0
