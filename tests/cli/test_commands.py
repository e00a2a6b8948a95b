"""The `nemo-gym-env` commands that serve the package's model servers alone, and the one logging
hand-off to verifiers' CLI handlers. Servers run as real processes of the installed command."""

from __future__ import annotations

import logging
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
from loguru import logger as loguru_logger
from verifiers.v1.utils.logging import setup_logging

from verifiers_nemogym.logs import follow_verifiers_logging
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.policies.replay import is_model_item, load_recordings
from verifiers_nemogym.util import wait_until

COMMAND = str(Path(sys.executable).with_name("nemo-gym-env"))
START_SECONDS = 120  # a loaded machine imports slowly; the first line comes as soon as it serves
TOOL = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}


class Server:
    """A `nemo-gym-env serve ...` process and the base URL of its first stdout line."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [COMMAND, "serve", *args, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        stdout = self.proc.stdout
        threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
        try:
            self.first_line = lines.get(timeout=START_SECONDS)
        except queue.Empty:
            self.stop()
            raise AssertionError(f"no line from {args} within {START_SECONDS} s") from None
        assert " on http://127.0.0.1:" in self.first_line, self.first_line
        self.base_url = self.first_line.split(" on ", 1)[1].split()[0]

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        """`sig`, then the exit status (the server must end on its own within 20 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("the server ignored SIGTERM") from None


async def post(base_url: str, body: dict) -> tuple[int, dict]:
    timeout = aiohttp.ClientTimeout(total=30)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        http.post(f"{base_url}/responses", json=body) as reply,
    ):
        return reply.status, await reply.json()


async def test_serve_scripted_calls_the_tool_then_stops_cleanly_on_ctrl_c():
    server = Server("scripted")
    try:
        assert server.first_line.startswith("scripted policy on ")
        status, reply = await post(server.base_url, {"input": "weather?", "tools": [TOOL]})
        assert status == 200 and reply["output"][0]["type"] == "function_call"
        assert reply["output"][0]["name"] == "lookup"
    finally:
        code = server.stop(signal.SIGINT)
    assert code == 0 and server.proc.stderr is not None
    assert "Traceback" not in server.proc.stderr.read()


async def test_serve_replay_answers_with_the_recorded_model_turn(nemo_venv):
    spec = Catalog(nemo_venv).env("example_single_tool_call")
    recording = load_recordings(spec.example_rollouts, spec.name)[0]
    params = recording.row["responses_create_params"]
    server = Server("replay", "--env", spec.name)
    try:
        count = len(load_recordings(spec.example_rollouts, spec.name))
        assert server.first_line.startswith(f"replay policy ({count} recordings) on ")
        body = {"input": params["input"], "tools": params.get("tools") or []}
        status, reply = await post(server.base_url, body)
        output = recording.row["response"]["output"]
        first_turn = []
        for item in output[next(i for i, x in enumerate(output) if is_model_item(x)) :]:
            if not is_model_item(item):
                break
            first_turn.append(item)
        assert status == 200 and reply["output"] == first_turn
    finally:
        assert server.stop() == 0


def test_serve_on_a_taken_port_is_a_one_line_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run(
            [COMMAND, "serve", "scripted", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip() == (
        f"nemo-gym-env: cannot listen on 127.0.0.1:{port} (Address already in use); "
        "choose another --port (0 picks a free one)"
    )


def test_serve_replay_needs_recordings_and_names_a_bad_file(tmp_path: Path):
    bare = subprocess.run([COMMAND, "serve", "replay"], capture_output=True, text=True, timeout=120)
    assert bare.returncode == 2 and "give at least one --env NAME or --rollouts FILE" in bare.stderr
    bad = tmp_path / "rollouts.jsonl"
    bad.write_text('{"responses_create_params": {}, "response": {"output": []}}\nnot json\n')
    run = subprocess.run(
        [COMMAND, "serve", "replay", "--rollouts", str(bad), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip() == f"nemo-gym-env: {bad}:2: not a JSON rollout: 'not json'"


def test_stack_up_or_down_by_config_file_names_a_missing_one(nemo_venv, tmp_path: Path):
    """`stack up` needs an ENV or a `--config-path` (tests/stack/test_shared_stack.py adopts a
    stack by its config file); a file that is not there is one line, before anything starts."""
    bare = subprocess.run([COMMAND, "stack", "up"], capture_output=True, text=True, timeout=120)
    assert bare.returncode == 2 and bare.stdout == ""
    assert bare.stderr.splitlines()[-1] == (
        "nemo-gym-env: error: stack up needs an ENV or a --config-path"
    )
    missing = tmp_path / "no.yaml"
    for command in ("up", "down"):
        run = subprocess.run(
            [COMMAND, "stack", command, "example_single_tool_call", "--config-path", str(missing)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 2 and run.stdout == ""
        assert run.stderr.splitlines()[-1] == (
            f"nemo-gym-env: error: --config-path: no such file: {missing}"
        )


def test_package_logs_reach_handlers_verifiers_sets_up_after_the_env_import(tmp_path: Path):
    # vf-eval imports the env module (which calls follow_verifiers_logging) while parsing its
    # arguments, and only then sets up its handlers: records must still reach them.
    import nemo_gym_env  # noqa: F401  (the import is the hand-off)

    library = logging.getLogger("verifiers.v1")
    saved = (list(library.handlers), library.level, library.propagate, logging.lastResort)
    root_records: list[logging.LogRecord] = []
    catcher = logging.Handler()
    catcher.emit = root_records.append  # type: ignore[method-assign]
    logging.getLogger().addHandler(catcher)
    eval_log = tmp_path / "eval.log"
    try:
        try:
            follow_verifiers_logging()  # idempotent: a second call changes nothing
            setup_logging("INFO", log_file=str(eval_log), console=False)
            logging.getLogger("verifiers_nemogym.nemo.stack").info("stack progress %d", 7)
            logging.getLogger("verifiers_nemogym.env").debug("below the CLI's level")
            wait_until(
                lambda: "stack progress 7" in eval_log.read_text(), time.monotonic() + 10, 0.05
            )
            text = eval_log.read_text()
            assert "INFO stack progress 7" in text and "below the CLI's level" not in text
            assert [r for r in root_records if r.name.startswith("verifiers_nemogym")] == []
        finally:
            loguru_logger.remove()
            library.handlers[:] = saved[0]
            library.setLevel(saved[1])
            library.propagate = saved[2]
            logging.lastResort = saved[3]
        # Without a CLI's handlers, records go on to the application's (root) handlers.
        logging.getLogger("verifiers_nemogym.nemo.stack").warning("no cli")
        assert [r.getMessage() for r in root_records] == ["no cli"]
    finally:
        logging.getLogger().removeHandler(catcher)
