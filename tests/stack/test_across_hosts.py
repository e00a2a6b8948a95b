"""A stack on one host, env servers on another: three network namespaces made by the test.

Host A runs `nemo-gym-env stack up ENV --listen 10.77.0.1:PORT` (one stack start for the whole
test). Host B runs verifiers' `serve_env` pool (2 workers) attached by `stack_url` +
`stack_pin` + a copy of the token file, the scripted policy and the `EnvClient` driving
rollouts (`DRIVER`). Host C is a third party on the same link (a bridge in C joins all three):
it holds no token, probes every listening port of A and B, and captures every frame to and from
A with a raw AF_PACKET socket (`CAPTURE`; there is no tcpdump here). Then the link of B is cut
mid-run and restored. Everything is real (NeMo Gym 0.4.0, Ray, verifiers' pool and client, the
proxies, the stack host) except the model, the scripted policy; addresses are namespace ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.evals import script
from helpers.processes import run_command, run_tag

from benchmarks.common import count_stack_programs
from benchmarks.netns import A, B, Hosts, handover
from verifiers_nemogym.errors import StackError
from verifiers_nemogym.harness import LOST_RUN_HINT
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.shared import client, protocol, tls

ENV = "example_single_tool_call"
AGENT = f"{ENV}_simple_agent"
PORT = 8443
CANARY = f"plaintext-canary-{uuid.uuid4().hex[:12]}"
"""In every row's prompt: found in the capture only if prompts crossed the link readable."""
PROBE_CANARY = f"probe-canary-{uuid.uuid4().hex[:12]}"
"""Sent in clear by the third party itself: the capture must show it (it sees payloads)."""
CUT_BOUND_S = 45.0
"""Rollouts in flight when the link goes must be errors within this many seconds of the cut
(`tls.LINK_TIMEOUT` 15 s after keepalive's first 5 s, slack for a loaded 2-core machine); also
the bound for the host to see the leases go."""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


CAPTURE = r"""
import signal, socket, sys
sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
sock.bind((sys.argv[1], 0))
sock.settimeout(0.5)
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
with open(sys.argv[2], "wb") as out:
    print("capturing", flush=True)
    while not stop:
        try:
            frame = sock.recv(65536)
        except TimeoutError:
            continue
        out.write(len(frame).to_bytes(4, "big") + frame)
"""

PROBE = r"""
import http.client, json, socket, ssl, sys
args = json.loads(sys.argv[1])
out = {"tcp": {}, "https": {}}
for host, port in args["targets"]:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.settimeout(5)
    try:
        sock.connect((host, port))
        out["tcp"][f"{host}:{port}"] = "open"
    except ConnectionRefusedError:
        out["tcp"][f"{host}:{port}"] = "refused"
    except OSError as e:
        out["tcp"][f"{host}:{port}"] = type(e).__name__
    finally:
        sock.close()
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
host, port = args["gate"]
upgrade = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
           "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
asks = [
    ("GET", "/stack", {}, None),
    ("GET", "/", {}, None),
    ("GET", "/lease", upgrade, None),
    ("POST", "/agents/" + args["agent"] + "/run", {"Content-Type": "application/json"},
     json.dumps({"responses_create_params": {"input": "hi"}}).encode() * 1000),
    ("POST", "/agents/" + args["agent"] + "/run", {"Authorization": "Bearer " + "x" * 43}, b"{}"),
    ("GET", "/stack", {"Authorization": "Bearer " + "x" * 43}, None),
]
for method, path, headers, body in asks:
    connection = http.client.HTTPSConnection(host, port, context=context, timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        answer = [response.status, response.read().decode()]
    except OSError as e:
        answer = [0, type(e).__name__]
    finally:
        connection.close()
    out["https"][f"{method} {path} {sorted(headers)}"] = answer
# Plain HTTP to the TLS port: no answer in clear; the request itself is the capture's control.
sock = socket.create_connection((host, port), 5)
sock.sendall(b"GET /stack HTTP/1.1\r\nHost: x\r\nX-Probe: " + args["canary"].encode() + b"\r\n\r\n")
sock.settimeout(5)
try:
    out["plain"] = sock.recv(4096).decode(errors="replace")
except OSError as e:
    out["plain"] = type(e).__name__
sock.close()
print(json.dumps(out))
"""

DRIVER = r"""
import asyncio, json, signal, subprocess, sys, time
import verifiers.v1 as vf
from verifiers.v1.configs.client import EvalClientConfig
from verifiers.v1.serve.client import EnvClient
from verifiers.v1.serve.pool import env_config_data
from verifiers_nemogym.net import free_port
from verifiers_nemogym.policies.scripted import ScriptedPolicy

SERVE = (
    "import json, sys\nfrom verifiers.v1.serve.pool import serve_env\n"
    "serve_env(**json.loads(sys.argv[1]))\n"
)


def emit(message):
    print(json.dumps(message), flush=True)


async def main(args):
    tasks = json.loads(open(args["tasks"]).read())
    async with ScriptedPolicy(hang_seconds=300) as policy:
        config = vf.resolve_env_config({"taskset": args["taskset"]})
        address = f"tcp://127.0.0.1:{free_port()}"
        serve = {"address": address, "config_data": env_config_data(config), "max_workers": 2,
                 "elastic": False}
        with open(args["log"], "wb") as log:
            server = subprocess.Popen(
                [sys.executable, "-c", SERVE, json.dumps(serve)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        client = EnvClient(address)
        model = EvalClientConfig(base_url=policy.base_url, api_key_var="SCRIPTED_KEY")

        async def one(i):
            began = time.monotonic()
            episode = await client.run(model, "scripted", vf.SamplingConfig(), tasks[i])
            errors = [e.message for e in episode.errors]
            errors += [e.message for t in episode.traces for e in t.errors]
            return {"i": i, "ok": episode.ok, "rewards": [t.reward for t in episode.traces],
                    "errors": errors, "done_at": time.time(), "seconds": time.monotonic() - began}

        async def batch(command):
            emit({"id": command["id"], "results": await asyncio.gather(*map(one, command["run"]))})

        async def hanging(n):
            while sum("[fault:hang]" in c.prompt for c in policy.calls) < n:
                await asyncio.sleep(0.1)
            emit({"hanging": n})

        running = set()
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            command = json.loads(line)
            if "run" in command:
                running.add(asyncio.create_task(batch(command)))
            elif "hanging" in command:
                running.add(asyncio.create_task(hanging(command["hanging"])))
            else:
                break
        for task in running:
            task.cancel()
        await client.close()
        server.send_signal(signal.SIGTERM)
        await asyncio.to_thread(server.wait, 120)


asyncio.run(main(json.loads(sys.argv[1])))
"""


class Driver:
    """`DRIVER` in host B: commands on its stdin, JSON answers on its stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.answers: list[dict[str, Any]] = []

    @classmethod
    async def start(
        cls, hosts: Hosts, args: dict[str, Any], env: dict[str, str], err: Path
    ) -> Driver:
        with err.open("wb") as stderr:
            proc = await asyncio.create_subprocess_exec(
                *hosts.run("b"), sys.executable, "-c", DRIVER, json.dumps(args),
                env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
            )  # fmt: skip
        return cls(proc)

    def send(self, command: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")

    async def answer(self, key: str, value: Any, seconds: float) -> dict[str, Any]:
        """The driver's answer whose `key` is `value`, within `seconds`."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(seconds):
            while True:
                line = await self.proc.stdout.readline()
                assert line, "the driver exited"
                message = json.loads(line)
                if message.get(key) == value:
                    return message

    async def stop(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ConnectionError):
                self.send({"stop": True})
            try:
                await asyncio.wait_for(self.proc.wait(), 150)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


def rows(nemo_venv: NeMoGymVenv, path: Path, hang: int, normal: int) -> Path:
    """`hang` rows whose model call hangs (`[fault:hang]`), then `normal` rows; every prompt
    carries CANARY and its own tag."""
    source = Catalog(nemo_venv).env(ENV).dataset().read_text().splitlines()
    examples = [json.loads(line) for line in source if line.strip()]
    with path.open("w") as out:
        for i in range(hang + normal):
            row = json.loads(json.dumps(examples[i % len(examples)]))
            for item in row["responses_create_params"]["input"]:
                if item.get("role") == "user":
                    fault = " [fault:hang]" if i < hang else ""
                    item["content"] = f"{item['content']} {CANARY} [#{i}]{fault}"
            out.write(json.dumps(row) + "\n")
    return path


def stack_directory(nemo_venv: NeMoGymVenv) -> Path:
    return client.stack_dir(client.stack_key(nemo_venv, Catalog(nemo_venv).env(ENV).config_paths))


async def host_status(nemo_venv: NeMoGymVenv) -> dict[str, Any] | None:
    try:
        return await protocol.status(stack_directory(nemo_venv), timeout=10)
    except StackError:
        return None


def frames(path: Path) -> list[bytes]:
    data = path.read_bytes()
    found, at = [], 0
    while at + 4 <= len(data):
        size = int.from_bytes(data[at : at + 4], "big")
        found.append(data[at + 4 : at + 4 + size])
        at += 4 + size
    return found


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    made = Hosts(f"vfng{uuid.uuid4().hex[:6]}")
    try:
        made.create()
        yield made
    finally:
        made.destroy()


async def test_stack_on_one_host_env_servers_on_another(
    nemo_venv: NeMoGymVenv, hosts: Hosts, tmp_path: Path
) -> None:
    assert await host_status(nemo_venv) is None, f"a shared stack for {ENV} already runs"
    _, env = run_tag(SCRIPTED_KEY="unused")
    cli = script("nemo-gym-env")
    capture_file = tmp_path / "capture.bin"
    capture = subprocess.Popen(
        [*hosts.run("c"), sys.executable, "-c", CAPTURE, "pa", str(capture_file)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    assert capture.stdout is not None and capture.stdout.readline().strip() == b"capturing"
    driver: Driver | None = None
    up = False
    began = time.monotonic()
    try:
        # --- host A: the stack, listening with TLS -----------------------------------------
        code, output = await run_command(
            [*hosts.run("a"), cli, "stack", "up", ENV, "--listen", f"{A}:{PORT}",
             "--idle-timeout", "900"],
            env, 900,
        )  # fmt: skip
        assert code == 0, output[-3000:]
        up = True
        print(f"\nstack up --listen in host A: {time.monotonic() - began:.0f} s")
        url = f"https://{A}:{PORT}"
        given = handover(output)
        assert given is not None and given.url == url, output
        directory = stack_directory(nemo_venv)
        assert Path(given.token_file) == directory / tls.TOKEN_FILE
        token = (directory / tls.TOKEN_FILE).read_text().strip()
        for private in (tls.TOKEN_FILE, tls.KEY_FILE):
            assert stat.S_IMODE((directory / private).stat().st_mode) == 0o600
        assert token not in output
        # The hand-over: a copy of the token file on host B, 0600.
        token_copy = tmp_path / "stack-token"
        shutil.copyfile(directory / tls.TOKEN_FILE, token_copy)
        token_copy.chmod(0o600)

        # --- host B: serve_env's pool attached by stack_url -----------------------------------
        hang, normal = 3, 8
        rows_file = rows(nemo_venv, tmp_path / "rows.jsonl", hang, normal)
        import nemo_gym_env

        tasks = [
            t.data.model_dump(mode="json")
            for t in nemo_gym_env.load_environment(nemo_env=ENV, jsonl_path=str(rows_file)).taskset
        ]
        (tmp_path / "tasks.json").write_text(json.dumps(tasks))
        taskset = {
            "id": "nemo-gym-env", "nemo_env": [ENV], "jsonl_path": str(rows_file),
            "stack_url": url, "stack_pin": given.pin, "stack_token_file": str(token_copy),
        }  # fmt: skip
        driver = await Driver.start(
            hosts,
            {"taskset": taskset, "tasks": str(tmp_path / "tasks.json"),
             "log": str(tmp_path / "env-server.log")},
            env, tmp_path / "driver.err",
        )  # fmt: skip
        normal_rows = list(range(hang, hang + normal))
        driver.send({"id": "before", "run": normal_rows})
        began = time.monotonic()
        before = await driver.answer("id", "before", 600)
        print(f"pool in host B up and {normal} rollouts scored: {time.monotonic() - began:.0f} s")
        assert [r["ok"] for r in before["results"]] == [True] * normal, before
        assert all(r["rewards"] == [1.0] for r in before["results"])
        info = await host_status(nemo_venv)
        assert info is not None and info["remote_users"] == 2 and info["users"] == 0, info
        code, shown = await run_command([cli, "stack", "status"], env, 120)
        assert code == 0 and f"at {url}" in shown and given.pin in shown, shown
        assert given.token_file in shown and token not in shown
        leases = info["remote_users"]
        marker = f"{MARKER_ENV_VAR}={info['marker']}"

        # --- host C: no token, so refused everywhere ------------------------------------------
        targets = [(A, port) for _, port in hosts.listeners("a")]
        targets += [(B, port) for _, port in hosts.listeners("b")]
        assert all(address.startswith(("127.", "::ffff:127.")) or (address, port) == (A, PORT)
                   for address, port in hosts.listeners("a")), hosts.listeners("a")  # fmt: skip
        assert all(a.startswith(("127.", "::ffff:127.")) for a, _ in hosts.listeners("b"))
        probe_args = {"targets": targets, "gate": [A, PORT], "agent": AGENT, "canary": PROBE_CANARY}
        code, output = await run_command(
            [*hosts.run("c"), sys.executable, "-c", PROBE, json.dumps(probe_args)], env, 120,
            stdout_only=True,
        )  # fmt: skip
        assert code == 0, output
        seen = json.loads(output)
        opened = {k for k, v in seen["tcp"].items() if v != "refused"}
        assert opened == {f"{A}:{PORT}"}, seen["tcp"]  # every other port of A and B: refused
        assert len(seen["tcp"]) > 10  # NeMo Gym's servers, Ray, the front, the proxies...
        for ask, (status, body) in seen["https"].items():
            assert status == 401, (ask, status, body)
            assert AGENT not in body and ENV not in body and "0.4.0" not in body, body
        assert "HTTP/1.1 200" not in seen["plain"] and ENV not in seen["plain"], seen["plain"]

        # --- the link cut mid-run: errors within a bound, the stack survives ----------------
        driver.send({"id": "cut", "run": list(range(hang))})
        driver.send({"hanging": hang})
        await driver.answer("hanging", hang, 300)  # every one of them waits on its model call
        cut_at = time.time()
        hosts.link_of_b(up=False)
        cut = await driver.answer("id", "cut", CUT_BOUND_S + 30)
        assert [r["ok"] for r in cut["results"]] == [False] * hang, cut
        late = max(r["done_at"] for r in cut["results"]) - cut_at
        assert late < CUT_BOUND_S, f"rollouts ended {late:.1f} s after the cut"
        for result in cut["results"]:  # the error says what may have gone: not "the agent died"
            assert LOST_RUN_HINT in result["errors"][0], result["errors"]
        print(f"\nrollouts in flight were errors {late:.1f} s after the link was cut:")
        print("  " + cut["results"][0]["errors"][0][:300])
        # The host's own kernel tells it the link went (keepalive, `tls.LINK_TIMEOUT`).
        while (info := await host_status(nemo_venv)) is None or info["remote_users"] > 0:
            assert time.time() - cut_at < CUT_BOUND_S, f"the host kept the leases: {info}"
            await asyncio.sleep(0.5)
        assert count_stack_programs(marker)["ng_run"] == 1  # the stack survived

        # --- the link back: the same env servers score again ---------------------------------
        hosts.link_of_b(up=True)
        began = time.monotonic()
        while (info := await host_status(nemo_venv)) is None or info["remote_users"] < leases:
            assert time.monotonic() - began < 60, f"leases did not come back: {info}"
            await asyncio.sleep(0.5)
        print(f"leases back {time.monotonic() - began:.1f} s after the link was restored")
        driver.send({"id": "after", "run": normal_rows})
        after = await driver.answer("id", "after", 300)
        assert [r["ok"] for r in after["results"]] == [True] * normal, after
        assert all(r["rewards"] == [1.0] for r in after["results"])

        await driver.stop()
        host_log = (directory / protocol.LOG).read_text(errors="replace")
        # Each worker leased twice (the same processes: before the cut and after it).
        pids = re.findall(r"remote user pid (\d+) attached from " + re.escape(B), host_log)
        assert len(pids) == 2 * leases and len(set(pids)) == leases, pids
        for text in (
            host_log,
            (tmp_path / "env-server.log").read_text(errors="replace"),
            (tmp_path / "driver.err").read_text(errors="replace"),
        ):
            assert token not in text
        code, output = await run_command([cli, "stack", "down", ENV], env, 180)
        assert code == 0, output
        up = False
    finally:
        if driver is not None:
            await driver.stop()
        if up:
            await run_command([cli, "stack", "down", ENV], env, 180)
        capture.send_signal(signal.SIGTERM)
        capture.wait(30)

    # Nothing of ours runs in any namespace any more.
    began = time.monotonic()
    while any(hosts.pids().values()) and time.monotonic() - began < 60:
        await asyncio.sleep(0.5)
    assert not any(hosts.pids().values()), hosts.pids()

    # What the third party saw on the link: encrypted bytes only.
    captured = frames(capture_file)
    data = b"".join(captured)
    print(f"captured {len(captured)} frames, {len(data)} bytes to and from host A")
    assert PROBE_CANARY.encode() in data  # it does see payloads in clear
    assert len(data) > 100_000
    for secret in (CANARY, token, "vf_nemogym_secret", "vf_nemogym_route", AGENT, "responses"):
        assert secret.encode() not in data, f"{secret[:20]}... crossed the link readable"
