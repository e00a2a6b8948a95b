"""prime-rl's process split for the tests, built from verifiers' own serve pieces (prime-rl
itself cannot be installed here): `load_tasks` runs what prime-rl's orchestrator runs in its own
process (`vf.load_taskset(config)`, then its tasks as JSON), `EnvServer` starts verifiers'
`serve_env` worker pool as a process of its own (what prime-rl spawns per source) with an
`EnvClient` in front, and `train_client` is verifiers' train client on a token server."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import verifiers.v1 as vf
from renderers.configs import DefaultRendererConfig
from verifiers.v1.configs.client import TrainClientConfig
from verifiers.v1.serve.client import EnvClient
from verifiers.v1.serve.pool import env_config_data

from helpers.evals import SERVE_ENV_SCRIPT
from helpers.processes import run_command
from verifiers_nemogym.net import free_port
from verifiers_nemogym.policies.gguf_tokenizer import tokenizer_dir
from verifiers_nemogym.policies.local_model import packaged_model_path

# What prime-rl's orchestrator runs, in its own process.
LOAD = (
    "import json, sys\n"
    "import verifiers.v1 as vf\n"
    "config = vf.resolve_env_config({'taskset': json.loads(sys.argv[1])})\n"
    "tasks = list(vf.load_taskset(config.taskset))\n"
    "print(json.dumps([t.data.model_dump(mode='json') for t in tasks]))\n"
)


async def load_tasks(python: str, taskset: dict[str, Any], env: dict[str, str]) -> list[dict]:
    """The tasks of `taskset` as `python` (another process, environment `env`) loads them."""
    code, out = await run_command(
        [python, "-c", LOAD, json.dumps(taskset)], env, 600, stdout_only=True
    )
    assert code == 0, out[-2000:]
    return json.loads(out.strip().splitlines()[-1])


class EnvServer:
    """`serve_env` in its own process (SIGTERM: verifiers' graceful teardown), and a client."""

    def __init__(self, python: str, taskset: dict[str, Any], env: dict[str, str], log: Path):
        config = vf.resolve_env_config({"taskset": taskset})
        self.address = f"tcp://127.0.0.1:{free_port()}"
        args = {
            "address": self.address,
            "config_data": env_config_data(config),
            "max_workers": 2,
            "elastic": False,
        }
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [python, "-c", SERVE_ENV_SCRIPT, json.dumps(args)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.client = EnvClient(self.address)

    async def run(self, client: Any, model: str, tasks: list[dict]) -> list[vf.Episode]:
        async def one(task: dict) -> vf.Episode:
            return await self.client.run(client, model, vf.SamplingConfig(), task)

        return list(await asyncio.gather(*(one(t) for t in tasks)))

    async def stop(self) -> None:
        await self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(self.proc.wait, 120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait)


def train_client(base_url: str, key_var: str) -> TrainClientConfig:
    """verifiers' train client on the token server at `base_url` (its key read from `key_var`),
    rendering with the packaged model's tokenizer."""
    return TrainClientConfig(
        base_url=base_url,
        api_key_var=key_var,
        renderer=DefaultRendererConfig(tool_parser="qwen3", reasoning_parser="think"),
        renderer_model_name=str(tokenizer_dir(packaged_model_path())),
    )
