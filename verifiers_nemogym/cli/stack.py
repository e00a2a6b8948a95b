"""`nemo-gym-env stack up|status|down`: persistent shared NeMo Gym stacks that env processes
attach to (docs/shared-stacks.md); the lease protocol itself is `shared/`'s."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verifiers_nemogym.cli.arguments import UsageError, add_judge_arguments, judge_of
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.venv import ensure_venv
from verifiers_nemogym.shared import tls

if TYPE_CHECKING:
    from verifiers_nemogym.shared.client import HostInfo


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = commands.add_parser("stack", help="shared NeMo Gym stacks that vf-eval attaches to")
    parser.set_defaults(func=run)
    stack_commands = parser.add_subparsers(dest="stack_command", required=True)
    up = stack_commands.add_parser("up", help="start (or keep) a stack until `stack down`")
    up.add_argument("envs", nargs="*", metavar="ENV", help="NeMo Gym environment name(s)")
    up.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        help="stop after this many seconds without users (default: only on `stack down`)",
    )
    up.add_argument("--start-timeout", type=float, default=900.0)
    up.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default=None,
        help="also serve env processes on other hosts there, with TLS and an access token "
        "(docs/shared-stacks.md#across-hosts); default: loopback only",
    )
    status = stack_commands.add_parser("status", help="list the shared stacks running here")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    down = stack_commands.add_parser("down", help="stop shared stacks and wait for them")
    down.add_argument("envs", nargs="*", metavar="ENV", help="default: every shared stack")
    for named in (up, down):  # the judge and the Ray cluster are part of a stack's identity
        named.add_argument(
            "--config-path",
            dest="config_paths",
            action="append",
            default=[],
            metavar="PATH",
            help="a NeMo Gym config file, as the taskset's `config_paths` takes it (relative to "
            "the NeMo Gym install, or absolute), with or instead of ENV; repeatable",
        )
        add_judge_arguments(named)
        named.add_argument(
            "--allow-unisolated-containers",
            action="store_true",
            help="run sandbox containers nemo-gym-env cannot isolate (not root, no iptables, "
            "rootless or remote docker, a provider other than docker): they reach this host's "
            "services (docs/containers.md)",
        )
        named.add_argument(
            "--ray-address",
            default=None,
            metavar="HOST:PORT",
            help="join this Ray cluster (its head's GCS port) instead of a private Ray; its "
            "token from RAY_AUTH_TOKEN_PATH, RAY_AUTH_TOKEN or ~/.ray/auth_token",
        )
    return parser


def run(args: argparse.Namespace) -> int:
    """`stack up|status|down`: print what happened; exit 1 if `down` found nothing to stop."""
    from verifiers_nemogym.nemo.ray_cluster import RayCluster
    from verifiers_nemogym.shared import client

    if args.stack_command == "up" and not (args.envs or args.config_paths):
        raise UsageError("stack up needs an ENV or a --config-path")
    if args.stack_command == "up" and args.listen is not None:
        tls.check_bindable(*tls.parse_listen(args.listen))  # before anything starts
    runtime = ensure_venv(args.nemo_gym_version, args.python)
    catalog = Catalog(runtime)

    def config_paths() -> list[Path]:
        """The stack's config files (its ENVs', then `--config-path`'s) as the taskset lists them
        (`NeMoGymTaskset.config_paths`), so that its key is the one vf-eval's env process seeks."""
        paths = [p for name in args.envs for p in catalog.env(name).config_paths]
        extra = [catalog.config_path(path) for path in args.config_paths]
        if missing := [str(path) for path in extra if not path.is_file()]:
            raise UsageError(f"--config-path: no such file: {', '.join(missing)}")
        return paths + extra

    if args.stack_command == "status":
        return _status(args.json, asyncio.run(client.list_hosts()))
    judge = judge_of(args)
    # The cluster `--ray-address` names, its token read as Ray reads it.
    ray = RayCluster.from_environ(args.ray_address) if args.ray_address else None
    if args.stack_command == "up":
        info = asyncio.run(
            client.bring_up(
                runtime,
                config_paths(),
                idle_timeout=args.idle_timeout,
                start_timeout=args.start_timeout,
                judge=judge,
                listen=args.listen,
                ray=ray,
                allow_unisolated_containers=args.allow_unisolated_containers,
            )
        )
        print(_describe(info))
        if listen := info.get("listen"):
            print(_describe_listen(listen))
        return 0
    hosts = asyncio.run(client.list_hosts())
    wanted = (
        client.stack_key(runtime, config_paths(), judge, ray, args.allow_unisolated_containers)
        if args.envs or args.config_paths
        else None
    )
    stopped = 0
    for host in hosts:
        if wanted is not None and host.directory.name != wanted:
            continue
        if host.status is None and host.pid is None:
            continue  # a socket nothing answers on, and no host process: nothing to stop
        # A host that does not answer (starting, wedged) is stopped by its pid.
        by_pid = None if host.status is not None else host.pid
        pid = asyncio.run(client.take_down(host.directory, pid=by_pid))
        print(f"stopped shared stack {host.directory.name} (host pid {pid})")
        stopped += 1
    if not stopped:
        print("no matching shared NeMo Gym stack is running", file=sys.stderr)
        return 1
    return 0


def _status(as_json: bool, hosts: list[HostInfo]) -> int:
    """`stack status`: each host's status (or why it gave none)."""
    if as_json:
        print(json.dumps([h.status or {"error": h.error} for h in hosts], indent=2))
        return 0
    if not hosts:
        print("no shared NeMo Gym stack is running")
    for host in hosts:
        print(_describe(host.status) if host.status else f"{host.directory}: {host.error}")
        if host.status and (listen := host.status.get("listen")):
            print(_describe_listen(listen))
    return 0


def _describe(info: dict[str, Any]) -> str:
    timeout = info.get("idle_timeout")
    idle = "until `stack down`" if timeout is None else f"idle timeout {timeout} s"
    return (
        f"shared stack {info['key']}: host pid {info['pid']}, head {info['head_url']}, "
        f"agents {', '.join(sorted(info['run_urls']))}, {info['users']} user(s), {idle}, "
        f"NeMo Gym {info['nemo_gym_version']} (Python {info['python_version']}), "
        + (
            f"judge {judge['model']} at {judge['base_url']}, "
            if (judge := info.get("judge"))
            else ""
        )
        + (f"Ray cluster {ray}, " if (ray := info.get("ray_address")) else "")
        + f"log {info['log']}"
    )


def _describe_listen(listen: dict[str, Any]) -> str:
    """What env processes on other hosts need (the token itself is never printed)."""
    return (
        f"listening for env processes on other hosts at {listen['url']}\n"
        f"  --env.taskset.stack-url {listen['url']} --env.taskset.stack-pin {listen['pin']}\n"
        f"  access token: the file {listen['token_file']} (mode 0600; hand it over as a file, "
        f"--env.taskset.stack-token-file FILE, or in ${tls.TOKEN_ENV_VAR}: never on a "
        "command line)"
    )
