"""`nemo-gym-env`: the project's own commands (evaluation itself is `vf-eval nemo-gym-env`).

nemo-gym-env setup [--nemo-gym-version V] [--python P]   create the NeMo Gym runtime venv
nemo-gym-env list                                         environments the runtime ships (both
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

The commands' printing, logging set-up and exit statuses live here (and in `local_eval.py`,
`serve.py`, `logs.py`); the library below never prints, parses arguments or exits, except the
two programs it starts as processes of their own (`nemo/host.py`, `nemo/supervisor.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verifiers_nemogym.cli.logs import configure_cli_logging
from verifiers_nemogym.cli.metrics import add_parser as add_metrics_parser
from verifiers_nemogym.cli.metrics import run as run_metrics
from verifiers_nemogym.cli.tasks import add_parser as add_tasks_parser
from verifiers_nemogym.cli.tasks import run as run_tasks
from verifiers_nemogym.errors import NeMoGymError
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.venv import BELOW_FLOOR_ENV_VAR, ensure_venv
from verifiers_nemogym.shared import tls

if TYPE_CHECKING:
    from verifiers_nemogym.judge.endpoint import Judge
    from verifiers_nemogym.nemo.ray_cluster import RayCluster


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
    commands.add_parser("setup", help="create (or show) the cached NeMo Gym runtime venv")
    listing = commands.add_parser("list", help="list the NeMo Gym environments the runtime ships")
    listing.add_argument(
        "--resolve",
        action="store_true",
        help="resolve every environment as a run would (NeMo Gym's resolver merges include/"
        "inherit configs: minutes when cold): merged configs' agents, or why one does not resolve",
    )
    conf = commands.add_parser(
        "conformance", help="replay NeMo Gym's recorded rollouts, compare rewards"
    )
    conf.add_argument("envs", nargs="*", metavar="ENV", help="default: every offline env")
    conf.add_argument("--json", action="store_true", help="machine-readable output")
    conf.add_argument("--strict", action="store_true", help="exit 1 on any reward mismatch")
    conf.add_argument("--concurrency", type=int, default=8, help="rollouts at once")
    conf.add_argument(
        "--judge-envs",
        action="store_true",
        help="without ENV: the LLM-judge environments whose recordings keep the judge's output",
    )
    conf.add_argument(
        "--enable-optional-judges",
        action="store_true",
        help="turn on the judges NeMo Gym ships off (math_with_judge, polymath)",
    )
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
    local.add_argument(
        "--judge",
        choices=["local"],
        default=None,
        help="local: the local model also judges (NeMo Gym's LLM-judge environments)",
    )
    local.add_argument(
        "--train", action="store_true", help="verifiers' train client: token ids on every call"
    )
    serve = commands.add_parser("serve", help="run one of the package's model servers alone")
    servers = serve.add_subparsers(dest="server", required=True)
    scripted = servers.add_parser("scripted", help="calls the first tool once, then answers")
    replay = servers.add_parser("replay", help="answers with NeMo Gym's recorded model turns")
    replay.add_argument("--env", action="append", default=[], help="NeMo Gym environment name")
    replay.add_argument(
        "--rollouts", action="append", default=[], type=Path, help="recorded rollouts JSONL"
    )
    tokens = servers.add_parser(
        "tokens", help="a scripted vLLM /inference/v1/generate server with a real tokenizer"
    )
    tokens.add_argument("--max-model-len", type=int, default=None, help="reported context size")
    tokens.add_argument(
        "--model",
        default="token-server",
        help="the model name /v1/models lists (prime-rl's orchestrator.model.name)",
    )
    answers = servers.add_parser(
        "answers", help="answers rows' math questions (Chat, Responses, Anthropic Messages)"
    )
    answers.add_argument(
        "--env", action="append", default=[], help="NeMo Gym environment: its example rows"
    )
    answers.add_argument(
        "--rows", action="append", default=[], type=Path, help="JSONL: question, expected_answer"
    )
    answers.add_argument(
        "--wrong", default="", help="row indices (0-based, comma-separated) to answer wrong"
    )
    fixer = servers.add_parser(
        "fixer", help="fixes container tasks in OpenCode's dialect (a bash tool call, then done)"
    )
    fixer.add_argument(
        "--tasks", action="append", default=[], type=Path, help="JSONL: key, fix, wrong[, name]"
    )
    fixer.add_argument(
        "--wrong", default="", help="task indices (0-based, comma-separated) to fix wrongly"
    )
    for server in (scripted, replay, tokens, answers, fixer):  # always on 127.0.0.1
        server.add_argument("--port", type=int, default=8000, help="0 picks a free one")
    stack = commands.add_parser("stack", help="shared NeMo Gym stacks that vf-eval attaches to")
    stack_commands = stack.add_subparsers(dest="stack_command", required=True)
    up = stack_commands.add_parser("up", help="start (or keep) a stack until `stack down`")
    up.add_argument("envs", nargs="+", metavar="ENV", help="NeMo Gym environment name(s)")
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
    _judge_arguments(up)
    _ray_argument(up)
    status = stack_commands.add_parser("status", help="list the shared stacks running here")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    down = stack_commands.add_parser("down", help="stop shared stacks and wait for them")
    down.add_argument("envs", nargs="*", metavar="ENV", help="default: every shared stack")
    _judge_arguments(down)
    _ray_argument(down)
    metrics_parser = add_metrics_parser(commands)
    add_tasks_parser(commands)
    _judge_arguments(metrics_parser)
    options = commands.add_parser("options", help="the --env.taskset.* options and their meaning")
    options.add_argument("--markdown", action="store_true", help="as docs/options.md")
    return parser


def _judge_arguments(parser: argparse.ArgumentParser) -> None:
    """The judge of a stack, named as vf-eval's `--env.taskset.judge.*` names it."""
    parser.add_argument("--judge.base-url", dest="judge_base_url", default=None)
    parser.add_argument("--judge.model", dest="judge_model", default=None)
    parser.add_argument("--judge.api-key-var", dest="judge_api_key_var", default=None)
    parser.add_argument("--judge.api", dest="judge_api", choices=["chat", "responses"])
    parser.add_argument(
        "--judge.enable-optional", dest="judge_enable_optional", action="store_true"
    )


def _ray_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ray-address",
        default=None,
        metavar="HOST:PORT",
        help="join this Ray cluster (its head's GCS port) instead of a private Ray; its token "
        "from RAY_AUTH_TOKEN_PATH, RAY_AUTH_TOKEN or ~/.ray/auth_token",
    )


def _ray(args: argparse.Namespace) -> RayCluster | None:
    """The Ray cluster `--ray-address` names (its token as Ray reads it), or None."""
    from verifiers_nemogym.nemo.ray_cluster import RayCluster

    return RayCluster.from_environ(args.ray_address) if args.ray_address else None


def _judge(args: argparse.Namespace) -> Judge | None:
    """The judge the `--judge.*` arguments name (with its key), or None."""
    from verifiers_nemogym.judge.config import NeMoGymJudgeConfig

    fields = {
        "base_url": args.judge_base_url, "model": args.judge_model,
        "api_key_var": args.judge_api_key_var, "api": args.judge_api,
    }  # fmt: skip
    given = {k: v for k, v in fields.items() if v is not None}
    if not given and not args.judge_enable_optional:
        return None
    return NeMoGymJudgeConfig(**given, enable_optional=args.judge_enable_optional).endpoint()


def _judge_fields(args: argparse.Namespace) -> dict[str, Any] | None:
    """The `--judge.*` arguments as `--env.taskset.judge` fields, or None."""
    fields = {
        "base_url": args.judge_base_url, "model": args.judge_model,
        "api_key_var": args.judge_api_key_var, "api": args.judge_api,
    }  # fmt: skip
    given = {k: v for k, v in fields.items() if v is not None}
    if args.judge_enable_optional:
        given["enable_optional"] = True
    return given or None


def _stack(args: argparse.Namespace) -> int:
    """`stack up|status|down`: print what happened; exit 1 if `down` found nothing to stop."""
    from verifiers_nemogym.shared import client as attach

    if args.stack_command == "up" and args.listen is not None:
        tls.check_bindable(*tls.parse_listen(args.listen))  # before anything starts
    runtime = ensure_venv(args.nemo_gym_version, args.python)
    catalog = Catalog(runtime)

    def config_paths(envs: list[str]) -> list[Path]:
        return [p for name in envs for p in catalog.env(name).config_paths]

    judge = _judge(args) if args.stack_command in ("up", "down") else None
    ray = _ray(args) if args.stack_command in ("up", "down") else None
    if args.stack_command == "up":
        info = asyncio.run(
            attach.bring_up(
                runtime,
                config_paths(args.envs),
                idle_timeout=args.idle_timeout,
                start_timeout=args.start_timeout,
                judge=judge,
                listen=args.listen,
                ray=ray,
            )
        )
        print(_describe(info))
        if listen := info.get("listen"):
            print(_describe_listen(listen))
        return 0
    hosts = asyncio.run(attach.list_hosts())
    if args.stack_command == "status":
        if args.json:
            print(json.dumps([h.status or {"error": h.error} for h in hosts], indent=2))
            return 0
        if not hosts:
            print("no shared NeMo Gym stack is running")
        for host in hosts:
            print(_describe(host.status) if host.status else f"{host.directory}: {host.error}")
            if host.status and (listen := host.status.get("listen")):
                print(_describe_listen(listen))
        return 0
    wanted = attach.stack_key(runtime, config_paths(args.envs), judge, ray) if args.envs else None
    stopped = 0
    for host in hosts:
        if wanted is not None and host.directory.name != wanted:
            continue
        if host.status is None and host.pid is None:
            continue  # a socket nothing answers on, and no host process: nothing to stop
        # A host that does not answer (starting, wedged) is stopped by its pid.
        by_pid = None if host.status is not None else host.pid
        pid = asyncio.run(attach.take_down(host.directory, pid=by_pid))
        print(f"stopped shared stack {host.directory.name} (host pid {pid})")
        stopped += 1
    if not stopped:
        print("no matching shared NeMo Gym stack is running", file=sys.stderr)
        return 1
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


def _conformance(args: argparse.Namespace) -> int:
    """Run, print the table (or JSON) on stdout; exit 1 on parity loss with `--strict`."""
    import nemo_gym_env
    from verifiers_nemogym.conformance import (
        default_envs,
        format_report,
        judge_envs,
        run_in_stacks,
    )

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


def _serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from verifiers_nemogym.cli.serve import replay_index, serve
    from verifiers_nemogym.policies.replay import ReplayPolicy
    from verifiers_nemogym.policies.scripted import ScriptedPolicy

    if args.server == "scripted":
        serve(ScriptedPolicy(port=args.port, record=False), "scripted policy")
        return 0
    if args.server == "tokens":
        from verifiers_nemogym.policies.token_server import TokenServer, packaged_tokenizer

        server = TokenServer(
            packaged_tokenizer(), port=args.port, model=args.model, max_model_len=args.max_model_len
        )
        serve(server, f"token server (model {server.model!r})")
        return 0
    if args.server == "answers":
        from verifiers_nemogym.cli.serve import answer_key_policy

        if not args.env and not args.rows:
            parser.error("serve answers: give at least one --env NAME or --rows FILE")
        answers = answer_key_policy(
            args.env, args.rows, args.wrong, args.port, args.nemo_gym_version, args.python
        )
        right = len(answers.rows) - len(answers.wrong)
        serve(answers, f"answer-key policy ({right} rows right, {len(answers.wrong)} wrong)")
        return 0
    if args.server == "fixer":
        from verifiers_nemogym.cli.serve import fixer_policy

        if not args.tasks:
            parser.error("serve fixer: give at least one --tasks FILE")
        fixer = fixer_policy(args.tasks, args.wrong, args.port)
        right = len(fixer.tasks) - len(fixer.wrong)
        serve(fixer, f"fixer policy ({right} tasks right, {len(fixer.wrong)} wrong)")
        return 0
    if not args.env and not args.rollouts:
        parser.error("serve replay: give at least one --env NAME or --rollouts FILE")
    index = replay_index(args.env, args.rollouts, args.nemo_gym_version, args.python)
    policy = ReplayPolicy(port=args.port, record=False, index=index)
    serve(policy, f"replay policy ({len(index.recordings)} recordings)")
    return 0


def _list_table(runtime: object, resolve: bool = False) -> str:
    """A Markdown table of both layouts: name, layout, agents, judge, runs here (yes: it ran
    here, in conformance runs or the harness survey; "yes, with --env.taskset.judge.*": an
    LLM-judge environment the judge conformance survey ran; no: why not, or not run yet), why.
    With `resolve`, every environment is resolved as a run would resolve it (`Catalog.env`):
    a merged config shows its agents and judge, one that does not resolve says why, and a line
    above the table counts the resolvable ones per layout."""
    from verifiers_nemogym.conformance import runs_here
    from verifiers_nemogym.nemo.catalog import (
        ENVIRONMENTS,
        RESOURCES_SERVERS,
        EnvSpec,
        load_config,
    )
    from verifiers_nemogym.nemo.judges import judge_need, judge_refs
    from verifiers_nemogym.nemo.venv import NeMoGymVenv

    assert isinstance(runtime, NeMoGymVenv)
    catalog = Catalog(runtime)
    found = catalog.resolve_each() if resolve else [(e, None) for e in catalog.entries()]
    lines = [
        f"NeMo Gym {runtime.nemo_gym_version} (Python {runtime.python_version}): "
        f"{len(found)} environments",
        "",
    ]
    if resolve:
        counts = [
            f"{sum(1 for e, s in found if e.layout == layout and isinstance(s, EnvSpec))} of "
            f"{sum(1 for e, _ in found if e.layout == layout)} {layout}"
            for layout in (RESOURCES_SERVERS, ENVIRONMENTS)
        ]
        lines += [f"resolvable: {', '.join(counts)}", ""]
    lines += ["| name | layout | agents | judge | runs here | why |", "|---|---|---|---|---|---|"]
    for entry, spec in found:
        runs, why = runs_here(entry.root.name, entry.problem, entry.facts, runtime.nemo_gym_version)
        agents = ", ".join(entry.agents) or ("(merged by NeMo Gym)" if entry.merged else "-")
        # The file itself (a merged config's judge is known once NeMo Gym merged it).
        judge = judge_need(entry.root.name, judge_refs(load_config(entry.config))) if (
            entry.config and not entry.merged) else "-"  # fmt: skip
        if isinstance(spec, EnvSpec):
            agents = ", ".join(a.name for a in spec.agents)
            merged = catalog.merged_config(spec.config_paths[0])
            judge = judge_need(entry.root.name, judge_refs(merged))
        elif spec is not None and runs != "yes":
            # (A container environment runs with an agent NeMo Gym pairs it with elsewhere: its
            # own config's lack of one is no reason.) Paths inside the release as the release
            # names them, not this machine's.
            reason = str(spec).replace(f"{catalog.root}/", "").replace("|", "\\|")
            agents, runs, why = "-", "no", reason
        lines.append(f"| {entry.name} | {entry.layout} | {agents} | {judge} | {runs} | {why} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # eval-local passes everything after `--` to vf-eval untouched.
    passthrough = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = _parser()
    args = parser.parse_args(argv)
    configure_cli_logging(timestamps=args.command == "conformance")
    if args.allow_python_below_floor:
        # Through the environment, so vf-eval (eval-local) and every library call see it.
        os.environ[BELOW_FLOOR_ENV_VAR] = "1"
    try:
        if args.command == "serve":
            return _serve(args, parser)
        if args.command == "conformance":
            return _conformance(args)
        if args.command == "stack":
            return _stack(args)
        if args.command == "metrics":
            return run_metrics(args, _judge_fields(args))
        if args.command == "make-tasks":
            return run_tasks(args)
        if args.command == "options":
            from verifiers_nemogym.options import options_markdown, options_text

            sys.stdout.write(options_markdown() if args.markdown else options_text() + "\n")
            return 0
        # Also before eval-local starts its model: an unusable Python fails fast.
        runtime = ensure_venv(args.nemo_gym_version, args.python)
        if args.command == "setup":
            print(
                f"NeMo Gym {runtime.nemo_gym_version} (Python {runtime.python_version}): "
                f"{runtime.venv}"
            )
        elif args.command == "list":
            print(_list_table(runtime, args.resolve))
        elif args.command == "eval-local":
            from verifiers_nemogym.cli.local_eval import (
                LocalEvalOptions,
                run_local_eval,
                token_counts,
            )
            from verifiers_nemogym.policies.local_model import chat_template_choice

            began = time.time()
            status = run_local_eval(
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
                    train=args.train,
                    judge=args.judge,
                )
            )
            if args.train:
                tokens, calls, rollouts = token_counts(args.output_dir, began)
                print(
                    f"train mode: {tokens}/{calls} model calls recorded token ids and logprobs "
                    f"({rollouts} rollouts)"
                )
            return status
    except NeMoGymError as e:
        print(f"nemo-gym-env: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
