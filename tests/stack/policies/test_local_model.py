"""The real local model (Qwen2.5-Coder-1.5B on llama.cpp, CPU) through the whole chain.

`nemo-gym-env eval-local` (the README's no-key command) -> vf-eval -> NeMoGymHarness -> NeMo Gym
agent `/run` -> model proxy -> verifiers endpoint -> local llama.cpp server. The model's wording is
never asserted: only that it called the tool with parseable arguments, that NeMo Gym's tool ran
with them, and that NeMo Gym verified the rollout. A small model may misbehave now and then, so
the evaluation is tried at most twice.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from helpers.evals import read_episodes, script
from helpers.processes import run_tag, wait_gone

from verifiers_nemogym.nemo.supervisor import processes_with_env
from verifiers_nemogym.policies.local_model import (
    MARKER_ENV_VAR,
    LocalModelServer,
    packaged_model_path,
)

ENV = "example_single_tool_call"
ATTEMPTS = 2


def tool_use_problems(trace: dict[str, Any]) -> list[str]:
    """Why `trace` is not "called get_weather with parseable arguments, NeMo Gym ran it"."""
    messages = [node["message"] for node in trace["nodes"]]
    calls = [c for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
    if not calls:
        return ["no tool call"]
    call = calls[0]
    if call["name"] != "get_weather":
        return [f"called {call['name']!r}"]
    try:
        arguments = json.loads(call["arguments"])
    except json.JSONDecodeError:
        return [f"arguments are not JSON: {call['arguments']!r}"]
    if not isinstance(arguments, dict) or not isinstance(arguments.get("city"), str):
        return [f"arguments without a city string: {arguments!r}"]
    results = [m for m in messages if m.get("role") == "tool" and m["tool_call_id"] == call["id"]]
    if not results:
        return ["no tool result for the call"]
    # NeMo Gym's resources server answered with the city the model asked for.
    if json.loads(results[0]["content"]).get("city") != arguments["city"]:
        return [f"tool result {results[0]['content']!r} is not for {arguments!r}"]
    return []


def run_eval_local(outdir: Path, env: dict[str, str]) -> tuple[int, str]:
    # One rollout: the claim is the chain, and CI's 2 cores are the model's (each rollout is
    # two generations on them).
    cmd = [script("nemo-gym-env"), "eval-local", ENV, "-n", "1", "-o", str(outdir)]
    proc = subprocess.run(
        cmd,
        env=env,  # its tag is inherited by every descendant
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=1100,
        stdin=subprocess.DEVNULL,
    )
    return proc.returncode, proc.stdout.decode(errors="replace")


@pytest.mark.timeout(ATTEMPTS * 1200)
def test_eval_local_runs_the_real_model_through_nemo_gym(tmp_path: Path) -> None:
    problems: list[str] = []
    for attempt in range(ATTEMPTS):
        tag, env = run_tag()
        outdir = tmp_path / f"attempt{attempt}"
        status, log = run_eval_local(outdir, env)
        # Whatever the model did, nothing the command started may survive it.
        survivors = processes_with_env(tag)
        # 60 s: a shared stack's host outlives the eval by its idle grace, then stops.
        assert wait_gone(survivors, 60), f"processes left behind: {survivors}"
        assert status == 0, log[-6000:]
        assert "ready at http://127.0.0.1:" in log  # the local server, on loopback
        episodes = read_episodes(outdir)
        assert len(episodes) == 1
        traces = [t for e in episodes for t in e["traces"]]
        assert all(e["ok"] for e in episodes), [e["errors"] for e in episodes]
        for trace in traces:
            # The rollout went through NeMo Gym's /verify: its reward, recorded by the harness.
            assert trace["info"]["nemo_gym"]["reward"] == 1.0
            assert trace["rewards"]["nemo_gym"]["score"] == 1.0
            assert trace["agent"]["config"]["model"] == "qwen2.5-coder-1.5b-instruct-q4_k_m"
        problems = [p for t in traces for p in tool_use_problems(t)]
        if not problems:
            return
    pytest.fail(f"the local model did not call the tool properly in {ATTEMPTS} runs: {problems}")


def test_server_serves_and_dies_with_its_owner(tmp_path: Path) -> None:
    """The model server of a SIGKILLed owner exits by itself (its stdin pipe closes), and
    removes the temp log its owner made for it."""
    owner_code = textwrap.dedent(
        """
        import json, sys, urllib.request
        from verifiers_nemogym.policies.local_model import LocalModelServer
        server = LocalModelServer().start()
        with urllib.request.urlopen(server.base_url + "/models", timeout=30) as reply:
            models = json.load(reply)
        print(json.dumps({"pid": server.pid, "marker": server.marker, "models": models,
                          "log": str(server.log_path)}))
        sys.stdout.flush()
        sys.stdin.read()  # until the test kills us
        """
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", owner_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline()
        assert line, "the owner exited before its server started"
        info = json.loads(line)
        model_ids = [m["id"] for m in info["models"]["data"]]
        assert model_ids == ["qwen2.5-coder-1.5b-instruct-q4_k_m"]
        assert processes_with_env(f"{MARKER_ENV_VAR}={info['marker']}") == [info["pid"]]
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        assert wait_gone(info["pid"], 15), "the model server outlived its owner"
        assert not Path(info["log"]).exists(), "the server's temp log outlived its owner"
    finally:
        owner.kill()
        owner.wait()


def test_stop_leaves_nothing_and_the_packaged_model_is_cached() -> None:
    path = packaged_model_path()
    assert path == packaged_model_path()  # assembled once, then reused as is
    assert path.read_bytes()[:4] == b"GGUF"
    server = LocalModelServer(gguf=path, chat_template="model").start()
    pid, marker = server.pid, server.marker
    assert server.rss_bytes() > 500 * 2**20  # the model is really loaded
    server.stop()
    server.stop()  # idempotent
    assert wait_gone(pid, 5) and processes_with_env(f"{MARKER_ENV_VAR}={marker}") == []
