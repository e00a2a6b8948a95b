"""`nemo-gym-env make-tasks OUT`: the hand-made container tasks, their images built here.

Builds the Debian base image (debootstrap from apt's mirror, `docker import`; once per docker
daemon) and each task's image on it (OpenCode baked in), then writes each environment's rows,
override config and the fixer policy's table under OUT (`containers.kit.make_tasks`), and
prints, per environment, the `--env.taskset.*` options that run it (docs/containers.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from verifiers_nemogym.containers.images import DEFAULT_OPENCODE
from verifiers_nemogym.containers.sandbox import PROVIDER_CONFIG


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "make-tasks",
        help="build the hand-made container tasks' images and write their rows and overrides",
    )
    parser.set_defaults(func=run)
    parser.add_argument("out", type=Path, metavar="OUT", help="folder for rows and configs")
    parser.add_argument(
        "--opencode", default=DEFAULT_OPENCODE, help="OpenCode version baked into the images"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Build and write (progress on the log), then print how to run each environment."""
    from verifiers_nemogym.containers.kit import make_tasks

    kit = make_tasks(args.out, opencode=args.opencode)
    for task in kit.tasks:
        paths = [*task.config_paths, PROVIDER_CONFIG.format(name="docker"), str(task.override)]
        print(f"{task.env} ({task.name}, image {task.image}):")
        print(f"  --env.taskset.config-paths {json.dumps(paths)!r}")
        print(f"  --env.taskset.jsonl-path {task.rows}")
        print(f"  --env.taskset.agent {task.agent}")
    print(f"fixer policy: nemo-gym-env serve fixer --tasks {kit.fixer_tasks}")
    return 0
