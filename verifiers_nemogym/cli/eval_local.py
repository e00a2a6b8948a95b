"""`nemo-gym-env eval-local`: a real `vf-eval nemo-gym-env` run against the local CPU model.

`run_local_eval(options)` starts a `LocalModelServer`, runs vf-eval as a child pointed at it (no
API key, nothing pushed; arguments after `--` go to vf-eval and win over the defaults here),
stops the server when vf-eval ends, fails or is interrupted, and returns vf-eval's exit status.
With `train` it goes through `GenerateAdapter` and verifiers' train client, and `token_counts`
reads back how many calls recorded token ids (docs/local-model.md, docs/training.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.nemo.supervisor import die_with_parent
from verifiers_nemogym.nemo.venv import ensure_venv
from verifiers_nemogym.policies.local_model import (
    ChatTemplate,
    LocalModelServer,
    chat_template_choice,
    packaged_model_path,
)

logger = logging.getLogger(__name__)

# Any value works: the local server checks no key, but verifiers reads one from this variable.
_KEY_VAR = "VF_NEMOGYM_LOCAL_KEY"


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "eval-local", help="vf-eval with a local CPU model, no API key (after --: vf-eval args)"
    )
    parser.set_defaults(func=run)
    # Each dest is a `LocalEvalOptions` field: `run` hands them over by name.
    parser.add_argument("nemo_env", nargs="?", default="example_single_tool_call", metavar="ENV")
    for flag, dest, default, what in (
        ("-n", "num_tasks", 3, "rows to evaluate"),
        ("-r", "rollouts", 1, "rollouts per row"),
        ("-c", "concurrency", 2, "rollouts at once"),
    ):
        metavar, text = flag[1].upper(), f"{what} (default {default})"
        parser.add_argument(flag, dest=dest, metavar=metavar, type=int, default=default, help=text)
    parser.add_argument("--max-turns", type=int, default=4, help="model calls per rollout")
    parser.add_argument("--gguf", type=Path, default=None, help="a GGUF model file of your own")
    parser.add_argument(
        "--chat-template",
        type=chat_template_choice,
        default="fenced-json",
        help="fenced-json (default), model, or a file",
    )
    parser.add_argument("-o", "--output-dir", type=Path, default=Path("outputs"))
    parser.add_argument(
        "--judge",
        choices=["local"],
        default=None,
        help="local: the local model also judges (NeMo Gym's LLM-judge environments)",
    )
    parser.add_argument(
        "--train", action="store_true", help="verifiers' train client: token ids on every call"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Run `run_local_eval` with the parsed options (`args.vf_eval_args`: what followed `--`);
    with `--train`, then print how many model calls recorded token ids. vf-eval's exit status.
    """
    ensure_venv(args.nemo_gym_version, args.python)  # before the model starts: fail fast
    began = time.time()
    status = run_local_eval(
        LocalEvalOptions(**{f.name: getattr(args, f.name) for f in fields(LocalEvalOptions)})
    )
    if args.train:
        tokens, calls, rollouts = token_counts(args.output_dir, began)
        print(
            f"train mode: {tokens}/{calls} model calls recorded token ids and logprobs "
            f"({rollouts} rollouts)"
        )
    return status


@dataclass
class LocalEvalOptions:
    """What `eval-local` evaluates and with which model."""

    nemo_env: str = "example_single_tool_call"
    """NeMo Gym environment name(s), comma-separated."""
    num_tasks: int = 3
    """Rows evaluated (vf-eval `-n`)."""
    rollouts: int = 1
    """Rollouts per row (vf-eval `-r`)."""
    concurrency: int = 2
    """Rollouts in flight (vf-eval `-c`); the server decodes two requests at a time."""
    max_turns: int = 4
    """Model calls per rollout before verifiers stops it (NeMo Gym's simple agent has no limit,
    and a small model may call a tool again and again); NeMo Gym still verifies the rollout."""
    gguf: Path | None = None
    """A GGUF model file instead of the packaged Qwen2.5-Coder-1.5B-Instruct."""
    chat_template: ChatTemplate | Path = "fenced-json"
    """Chat template of the server (see `LocalModelServer.chat_template`)."""
    output_dir: Path = Path("outputs")
    """vf-eval's output folder."""
    nemo_gym_version: str | None = None
    """Passed on as `--env.taskset.nemo-gym-version` when set."""
    python: str | None = None
    """Passed on as `--env.taskset.python` when set."""
    vf_eval_args: list[str] = field(default_factory=list)
    """Further vf-eval arguments, appended last."""
    judge: str | None = None
    """`local`: the local model also judges NeMo Gym's LLM-judge environments (a demo that
    needs no key; a 1.5B model is no trustworthy grader)."""
    train: bool = False
    """Run with verifiers' train client: token ids and logprobs on every call (see module doc).
    The renderer uses the GGUF's own chat template (`chat_template` is not used then)."""


# How verifiers' renderer reads the packaged Qwen2.5 model: its own chat template (loaded with
# the tokenizer), tool calls as <tool_call> JSON (Hermes, the `qwen3` parser), <think> reasoning.
TRAIN_RENDERER_ARGS = [
    "--client.renderer.name", "default", "--client.renderer.tool-parser", "qwen3",
    "--client.renderer.reasoning-parser", "think",
]  # fmt: skip


def vf_eval_command(
    options: LocalEvalOptions,
    model: str,
    base_url: str,
    tokenizer: Path | None = None,
    judge_url: str | None = None,
) -> list[str]:
    """The vf-eval command line for a server at `base_url` serving `model`; with `tokenizer`
    (a tokenizer folder), for verifiers' train client; with `judge_url` (the local server's
    own base URL), that server judges too."""
    vf_eval = Path(sys.executable).with_name("vf-eval")
    if not vf_eval.exists():
        raise ConfigError(f"vf-eval not found beside {sys.executable}; is verifiers installed?")
    cmd = [
        str(vf_eval), "nemo-gym-env", "-m", model,
        "--client.base-url", base_url, "--client.api-key-var", _KEY_VAR,
        "-n", str(options.num_tasks), "-r", str(options.rollouts),
        "-c", str(options.concurrency), "--no-push", "-o", str(options.output_dir),
        "--env.taskset.nemo-env", options.nemo_env,
        "--env.agent.max-turns", str(options.max_turns),
    ]  # fmt: skip
    if options.nemo_gym_version:
        cmd += ["--env.taskset.nemo-gym-version", options.nemo_gym_version]
    if options.python:
        cmd += ["--env.taskset.python", options.python]
    if judge_url is not None:
        cmd += [
            "--env.taskset.judge.base-url", judge_url, "--env.taskset.judge.model", model,
            "--env.taskset.judge.api-key-var", _KEY_VAR,
        ]  # fmt: skip
    if tokenizer is not None:
        cmd += [
            "--client.type", "train", "--client.renderer-model-name", str(tokenizer),
            *TRAIN_RENDERER_ARGS,
        ]  # fmt: skip
    return cmd + list(options.vf_eval_args)


def run_local_eval(options: LocalEvalOptions) -> int:
    """Serve the local model, run vf-eval against it, stop the model; vf-eval's exit status."""
    for name in ("num_tasks", "rollouts", "concurrency", "max_turns"):
        if getattr(options, name) < 1:
            raise ConfigError(f"eval-local: {name} must be >= 1, got {getattr(options, name)}")
    tokenizer = None
    if options.train:
        from verifiers_nemogym.policies.gguf_tokenizer import tokenizer_dir

        logger.info("preparing the tokenizer from the GGUF (built once, then cached) ...")
        tokenizer = tokenizer_dir(options.gguf or packaged_model_path())
    chat_template = "model" if options.train else options.chat_template
    server = LocalModelServer(gguf=options.gguf, chat_template=chat_template)
    with server, _generate_adapter(server, options.train) as base_url:
        logger.info(
            "local model %s at %s (%d MB resident)",
            server.model_name,
            base_url,
            server.rss_bytes() // 2**20,
        )
        judge_url = server.base_url if options.judge == "local" else None
        cmd = vf_eval_command(options, server.model_name, base_url, tokenizer, judge_url)
        logger.info("running: %s", " ".join(cmd[1:]))
        # Same process group: a Ctrl-C reaches vf-eval (which stops its NeMo Gym stack) and us
        # (which stops the model server once vf-eval has exited). SIGTERM when we die, so a
        # killed `eval-local` leaves no vf-eval running (vf-eval's stack supervisor then sees
        # its owner go and stops the stack).
        die = die_with_parent(os.getpid(), signal.SIGTERM)
        proc = subprocess.Popen(cmd, env={**os.environ, _KEY_VAR: "local"}, preexec_fn=die)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            try:
                return proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.wait()


@contextlib.contextmanager
def _generate_adapter(server: LocalModelServer, train: bool) -> Iterator[str]:
    """The base URL vf-eval is given: the server's own, or (train) a `GenerateAdapter` in front
    of it, served from a thread of this process until the block ends."""
    if not train:
        yield server.base_url
        return
    from verifiers_nemogym.policies.llama_generate import GenerateAdapter

    adapter = GenerateAdapter(server.base_url, server.model_name, server.context)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="generate-adapter", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(adapter.start(), loop).result(timeout=60)
        yield adapter.base_url
    finally:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(adapter.stop(), loop).result(timeout=60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=60)
        loop.close()


def token_counts(output_dir: Path, since: float) -> tuple[int, int, int]:
    """(model calls whose assistant node holds token ids and one logprob per sampled token,
    model calls, rollouts) over the `traces.jsonl` files under `output_dir` written after
    `since` (a `time.time()`)."""
    with_tokens = calls = rollouts = 0
    for path in output_dir.rglob("traces.jsonl"):
        if path.stat().st_mtime < since:
            continue
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            for trace in json.loads(line).get("traces", []):
                rollouts += 1
                nodes = trace.get("nodes") or []
                for call in trace.get("calls") or []:
                    calls += 1
                    node = call.get("node")
                    if not isinstance(node, int) or node >= len(nodes):
                        continue
                    mask = nodes[node].get("mask") or []
                    logprobs = nodes[node].get("logprobs") or []
                    if nodes[node].get("token_ids") and len(logprobs) == sum(mask) > 0:
                        with_tokens += 1
    return with_tokens, calls, rollouts
