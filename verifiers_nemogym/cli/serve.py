"""`nemo-gym-env serve scripted|replay|tokens|answers|fixer`: one of the package's model
servers, until Ctrl-C.

`serve(policy)` starts `policy`, writes one line naming its base URL to stdout, serves until
SIGINT or SIGTERM, then stops it; `replay_index`, `answer_key_policy` and `fixer_policy` build
what the replay, answer-key and fixer servers answer from.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path

from verifiers_nemogym.cli.arguments import UsageError
from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.venv import ensure_venv
from verifiers_nemogym.policies.answer_key import AnswerKeyPolicy, AnswerRow, load_answer_key
from verifiers_nemogym.policies.fixer import FixerPolicy, FixTask, load_fix_tasks
from verifiers_nemogym.policies.replay import Recording, ReplayIndex, ReplayPolicy, load_recordings
from verifiers_nemogym.policies.scripted import ScriptedPolicy
from verifiers_nemogym.policies.server import ResponsesServer
from verifiers_nemogym.policies.token_server import TokenServer, packaged_tokenizer


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = commands.add_parser("serve", help="run one of the package's model servers alone")
    parser.set_defaults(func=run)
    servers = parser.add_subparsers(dest="server", required=True)
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
    return parser


def run(args: argparse.Namespace) -> int:
    """Build the server `args.server` names and serve it until SIGINT/SIGTERM (`serve`); a
    server given nothing to answer from is a UsageError."""
    if args.server == "scripted":
        serve(ScriptedPolicy(port=args.port, record=False), "scripted policy")
    elif args.server == "tokens":
        server = TokenServer(
            packaged_tokenizer(), port=args.port, model=args.model, max_model_len=args.max_model_len
        )
        serve(server, f"token server (model {server.model!r})")
    elif args.server == "answers":
        if not args.env and not args.rows:
            raise UsageError("serve answers: give at least one --env NAME or --rows FILE")
        answers = answer_key_policy(
            args.env, args.rows, args.wrong, args.port, args.nemo_gym_version, args.python
        )
        right = len(answers.rows) - len(answers.wrong)
        serve(answers, f"answer-key policy ({right} rows right, {len(answers.wrong)} wrong)")
    elif args.server == "fixer":
        if not args.tasks:
            raise UsageError("serve fixer: give at least one --tasks FILE")
        fixer = fixer_policy(args.tasks, args.wrong, args.port)
        right = len(fixer.tasks) - len(fixer.wrong)
        serve(fixer, f"fixer policy ({right} tasks right, {len(fixer.wrong)} wrong)")
    else:
        if not args.env and not args.rollouts:
            raise UsageError("serve replay: give at least one --env NAME or --rollouts FILE")
        index = replay_index(args.env, args.rollouts, args.nemo_gym_version, args.python)
        policy = ReplayPolicy(port=args.port, record=False, index=index)
        serve(policy, f"replay policy ({len(index.recordings)} recordings)")
    return 0


def replay_index(
    envs: list[str], files: list[Path], nemo_gym_version: str, python: str | None
) -> ReplayIndex:
    """The recorded rollouts of NeMo Gym environments `envs` (labelled by name) and of JSONL
    `files` (labelled by stem). Raises ConfigError for unknown environments or bad files."""
    recordings: list[Recording] = []
    if envs:
        catalog = Catalog(ensure_venv(nemo_gym_version, python))
        for name in envs:
            recordings += load_recordings(catalog.env(name).example_rollouts, name)
    for path in files:
        recordings += load_recordings(path)
    return ReplayIndex(recordings)


def answer_key_policy(
    envs: list[str],
    files: list[Path],
    wrong: str,
    port: int,
    nemo_gym_version: str | None,
    python: str | None,
) -> AnswerKeyPolicy:
    """An answer-key server (not started, no call log) on the example rows of NeMo Gym
    environments `envs`, then the rows of JSONL `files`, in that order; `wrong`: comma-separated
    0-based indices into those rows. Raises ConfigError for unknown environments, bad files or
    indices."""
    rows: list[AnswerRow] = []
    if envs:
        catalog = Catalog(ensure_venv(nemo_gym_version, python))
        for name in envs:
            rows += load_answer_key(catalog.env(name).dataset("example"))
    for path in files:
        rows += load_answer_key(path)
    return AnswerKeyPolicy(port=port, record=False, rows=rows, wrong=_indices(wrong, "row"))


def fixer_policy(files: list[Path], wrong: str, port: int) -> FixerPolicy:
    """A fixer server (not started, no call log) on the tasks of JSONL `files`, in order;
    `wrong`: comma-separated 0-based indices into those tasks. Raises ConfigError for bad files
    or indices."""
    tasks: list[FixTask] = []
    for path in files:
        tasks += load_fix_tasks(path)
    return FixerPolicy(port=port, record=False, tasks=tasks, wrong=_indices(wrong, "task"))


def _indices(wrong: str, what: str) -> frozenset[int]:
    """`--wrong`'s comma-separated 0-based indices; ConfigError naming `what` they index."""
    try:
        return frozenset(int(i) for i in wrong.split(",") if i.strip())
    except ValueError:
        raise ConfigError(f"--wrong {wrong!r}: give {what} indices, e.g. --wrong 1,3") from None


async def _serve(policy: ResponsesServer | TokenServer, what: str) -> None:
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    try:
        await policy.start()
    except OSError as e:
        reason = os.strerror(e.errno) if e.errno else str(e)  # aiohttp's strerror is long
        raise ConfigError(
            f"cannot listen on {policy.host}:{policy.port} ({reason}); "
            "choose another --port (0 picks a free one)"
        ) from None
    try:
        print(f"{what} on {policy.base_url}", flush=True)
        await stopped.wait()
    finally:
        await policy.stop()


def serve(policy: ResponsesServer | TokenServer, what: str) -> None:
    """Serve `policy` until SIGINT/SIGTERM; `what` names it in the line written to stdout.
    A port that cannot be bound raises ConfigError."""
    asyncio.run(_serve(policy, what))
