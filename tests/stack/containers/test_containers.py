"""NeMo Gym 0.7's container environments end to end on the real chain: vf-eval (or Python) ->
NeMoGymHarness -> NeMo Gym's environment server and `opencode_sandboxed_agent` -> a real docker
container of a task image built from Debian packages (no registry), OpenCode 1.17.11 inside it ->
the door on the stack's container network -> the model proxy (routed by the rollout id in the
path) -> verifiers' interception -> the fixer policy. Nothing is mocked but the model.

Tasks are the package's hand-made ones (`containers.kit`): swebench_pro `tinycalc` and
terminal_bench_2_1 `wordstats`. Each row is copied per case with its problem made unique (a case
tag), so the fixer's log tells which rollout every call belongs to; the fixer makes the right fix
(NeMo Gym's reward 1.0) or a useless edit (0.0), chosen per case.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from helpers.evals import check_train_episodes, eval_traces, model_context, vf_eval_command
from helpers.processes import gone, run_tag, until
from helpers.stacks import HeldStack, hold_shared_stack, runtime_flags, stack_host_log

import nemo_gym_env
from verifiers_nemogym.containers import docker
from verifiers_nemogym.containers.kit import TaskKit, make_tasks
from verifiers_nemogym.containers.sandbox import APT_NO_RETRIES, PROVIDER_CONFIG, STACK_LABEL
from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR, processes_with_env
from verifiers_nemogym.nemo.venv import (
    RAY_TMPDIR_PREFIX,
    WORKDIR_LOCK,
    WORKDIR_PREFIX,
    NeMoGymVenv,
    prune_stale_workdirs,
)
from verifiers_nemogym.phases import PHASES
from verifiers_nemogym.policies.fixer import WRITTEN_REWARD, FixerPolicy, FixTask
from verifiers_nemogym.util import try_flock

ENVS = ("swebench_pro", "terminal_bench_2_1", "swe_next")
DOCKER_CONFIG = PROVIDER_CONFIG.format(name="docker")


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> TaskKit:
    """The hand-made tasks and their images (the base image from Debian packages, built once
    per machine; task images rebuilt from docker's cache in seconds)."""
    return make_tasks(tmp_path_factory.mktemp("kit"))


def _flags(runtime: NeMoGymVenv) -> dict[str, Any]:
    return {
        "nemo_gym_version": "0.7.0",
        "python": str(runtime.python),
        "allow_python_below_floor": True,
    }


def config_paths(kit: TaskKit, envs: tuple[str, ...]) -> list[str]:
    """NeMo Gym's pairings of `envs`, the docker provider config, then the kit's overrides: the
    way a NeMo Gym user composes them."""
    tasks = [kit.task(env) for env in envs]
    return [
        *(p for t in tasks for p in t.config_paths),
        DOCKER_CONFIG,
        *(str(t.override) for t in tasks),
    ]


def case_rows(kit: TaskKit, cases: list[tuple[str, bool]], path: Path) -> list[FixTask]:
    """One row per case (`(env, right)`), its problem tagged with the case, naming NeMo Gym's
    paired agent, written to `path`; the fixer's table in the same order (the case's index)."""
    table, lines = [], []
    for i, (env, _) in enumerate(cases):
        task = kit.task(env)
        tagged = f"{task.fix.key} (case {i})"
        row = json.loads(task.rows.read_text().splitlines()[0])
        text = json.dumps(row).replace(json.dumps(task.fix.key)[1:-1], json.dumps(tagged)[1:-1])
        row = json.loads(text)
        assert tagged in json.dumps(row["responses_create_params"]), env
        row["agent_ref"] = {"type": "responses_api_agents", "name": task.agent}
        lines.append(json.dumps(row))
        table.append(replace(task.fix, key=tagged, name=f"{task.fix.name}-{i}"))
    path.write_text("\n".join(lines) + "\n")
    return table


def wrong_cases(cases: list[tuple[str, bool]]) -> frozenset[int]:
    return frozenset(i for i, (_, right) in enumerate(cases) if not right)


WRITER_CASE = ("terminal_bench_2_1", False)
"""The case whose model makes the useless edit and leaves a background loop writing
`WRITTEN_REWARD` to the reward file terminal_bench_2_1 reads in the agent's own container."""


def check_reward_writer(trace: dict[str, Any]) -> None:
    """The writer's rollout scored its honest reward (0.0: the edit is useless), never the
    written one: its leftover processes were ended before NeMo Gym ran the tests, and NeMo
    Gym's declared reward range for terminal_bench_2_1 was on its trace."""
    assert trace["errors"] == [], trace["errors"]
    assert trace["rewards"]["nemo_gym"]["score"] == 0.0 != float(WRITTEN_REWARD)
    assert trace["info"]["nemo_gym_reward_range"]["range"] == [0.0, 1.0], trace["info"]


def check_phases(trace: dict[str, Any], calls: int) -> None:
    """The trace's phases (`info["nemo_gym_phases"]`) count its `calls`, add up to NeMo Gym's
    `/run`, and that to within 5 % of verifiers' own agent time."""
    phases = trace["info"]["nemo_gym_phases"]
    assert phases["model_calls"] == calls, phases
    assert all(phases[p] >= 0 for p in PHASES) and phases["model"] > 0, phases
    assert abs(sum(phases[p] for p in PHASES) - phases["run"]) < 0.01, phases
    agent = trace["timing"]["agent"]
    took = agent["end"] - agent["start"]
    assert 0.95 * took <= phases["run"] <= took + 0.001, (phases, agent)  # phases: to the ms


def case_of(trace: dict[str, Any], table: list[FixTask]) -> int:
    """The case a trace's task carries (the longest key it quotes)."""
    text = json.dumps(trace["task"])
    found = [i for i, t in enumerate(table) if json.dumps(t.key)[1:-1] in text]
    return max(found, key=lambda i: len(table[i].key))


def stack_containers(marker: str | None = None) -> list[str]:
    """IDs of the containers of one stack (`marker`) or of every stack of ours."""
    label = STACK_LABEL if marker is None else f"{STACK_LABEL}={marker}"
    return docker.run_docker("ps", "-aq", "--filter", f"label={label}").split()


LOOKUP = (
    "python3 -c 'import socket, time; t = time.time()\n"
    'try: socket.getaddrinfo("deb.debian.org", 80); r = "resolved"\n'
    "except OSError as e: r = type(e).__name__\n"
    'print("LOOKUP %.3f %s" % (time.time() - t, r))\''
)
APT_CHECK = (
    f"{{ apt-config dump Acquire::Retries; if (echo x >> {APT_NO_RETRIES}) 2>/dev/null; "
    "then echo APT-WRITABLE; else echo APT-READ-ONLY; fi; }"
)


async def test_container_environments_score_and_never_cross_route(
    nemo_venv_07: NeMoGymVenv, kit: TaskKit, tmp_path: Path
) -> None:
    """swebench_pro, terminal_bench_2_1 and swe_next (whose rows name their own image) mixed on
    one stack through vf-eval at -c 3, OpenCode in each task's container: NeMo Gym's rewards
    (1.0 right fix, 0.0 useless edit), three rollouts in flight never cross-routed (the fixer's
    log), every turn in the trace, and afterwards no container, network or process of the
    stack. Each trace says where its time went (`info["nemo_gym_phases"]`: start, model, tools,
    finish, adding up to NeMo Gym's `/run` and to within 5 % of verifiers' own agent time), and
    a name lookup in a container fails within a second (the stack's refusing name server;
    docker's embedded DNS alone leaves it ~10 s to time out)."""
    # Each environment's right fix; a useless edit's 0.0 for swe_next, and for terminal_bench_2_1
    # as the writer's case (its 0.0 then also shows the written reward never counts). swebench_pro's
    # useless edit scores 0.0 in the hostile-code test below. Five rollouts, two waves at -c 3.
    cases = [(env, True) for env in ENVS] + [("swe_next", False), WRITER_CASE]
    table = case_rows(kit, cases, tmp_path / "rows.jsonl")
    table[0] = replace(table[0], fix=f"{LOOKUP} && {APT_CHECK} && {table[0].fix}")
    # swebench_pro writes verifier logs beside its code: in the stack's folder, not the runtime.
    runtime_logs = nemo_venv_07.site_packages / "resources_servers" / "swebench_pro" / "logs"
    logs_before = set(runtime_logs.rglob("*"))
    writer = frozenset({len(cases) - 1})
    async with FixerPolicy(tasks=table, wrong=wrong_cases(cases), writer=writer) as policy:
        cmd = vf_eval_command(
            "policy", policy.base_url, "FIXER_KEY", len(cases), 1, 3, tmp_path / "out",
            "--env.taskset.config-paths", json.dumps(config_paths(kit, ENVS)),
            "--env.taskset.jsonl-path", str(tmp_path / "rows.jsonl"),
            "--env.taskset.stack-idle-grace", "0",
            *runtime_flags(nemo_venv_07),
        )  # fmt: skip
        tag, traces = await eval_traces(cmd, tmp_path / "out", len(cases), 1500, FIXER_KEY="unused")
    for trace in traces:
        case = case_of(trace, table)
        if case in writer:
            check_reward_writer(trace)
        expected = 1.0 if cases[case][1] else 0.0
        assert trace["rewards"]["nemo_gym"]["score"] == expected, (cases[case], trace["errors"])
    # Every call came through the interception session of the rollout whose case it quotes.
    by_session = {t["id"]: t for t in traces}
    calls: Counter[str] = Counter()
    steps: Counter[int] = Counter()
    for call in policy.log:
        assert call.session_id in by_session, call.path
        calls[call.session_id] += 1
        if call.task is not None:
            assert call.task == case_of(by_session[call.session_id], table), call.session_id
            steps[call.task] += call.step in ("fix", "final")
    for trace in traces:
        assert len(trace["calls"]) == calls[trace["id"]] > 0  # every turn in the trace
        check_phases(trace, calls[trace["id"]])
    assert all(steps[i] == 2 for i in range(len(cases))), steps  # the fix, then the final turn
    final = next(c for c in policy.log if c.step == "final" and c.task == 0)
    tool = next(m for m in final.body["messages"] if m.get("role") == "tool")
    content = tool["content"] if isinstance(tool["content"], str) else json.dumps(tool["content"])
    seconds, outcome = content[content.index("LOOKUP ") + 7 :].split()[:2]
    assert outcome == "gaierror" and float(seconds) < 1.0, (seconds, outcome)
    # apt gives up at once (nothing off the machine answers), and the container cannot undo it.
    assert 'Acquire::Retries "0";' in content and "APT-READ-ONLY" in content, content[-2000:]
    # The shared stack's host logs how its containers are isolated and bounded.
    host_text = stack_host_log(tmp_path / "out")
    assert "on the host they reach the door only (firewall)" in host_text
    assert "pids limit 1024, disk unbounded, dropped capabilities NET_RAW," in host_text
    assert "keepalive 'sleep 3600' (then removed), apt without retries" in host_text
    assert await gone(tag) == []
    # Every container and the network of the run's stack removed (named in its host's log).
    network = re.search(r"join docker network (vfng-\w+)", host_text)
    assert network is not None, host_text[-2000:]
    prefix = network.group(1).removeprefix(docker.NETWORK_PREFIX)
    left = [m for m in docker._stack_markers() if m.startswith(prefix)]
    assert left == [], left
    assert set(runtime_logs.rglob("*")) == logs_before
    # The host log read again, after the stack has stopped: the servers run from its folder.
    shadowed = re.search(
        r"INFO \S+: (.+) run from the stack's folder", stack_host_log(tmp_path / "out")
    )
    assert shadowed is not None
    assert {"resources_servers/swebench_pro", "resources_servers/terminal_bench_2_1"} <= set(
        shadowed.group(1).split(", ")
    )


PROBE = r"""
import asyncio, base64, json, os, resource, socket, sys
from collections import Counter
args = json.loads(base64.b64decode(sys.argv[1]))
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
config = json.loads(os.environ.get("OPENCODE_CONFIG_CONTENT", "{}"))
base = config["provider"]["nemo_gym"]["options"]["baseURL"].rstrip("/")
door, rollout = base.split("/ng-rollout/")[0], base.split("/ng-rollout/")[1].split("/")[0]
door_host, door_port = door.removeprefix("http://").rsplit(":", 1)
door_port = int(door_port)
route, credential = rollout.rsplit(".", 1)
prefix, number = route.rsplit("-", 1)
n = int(number, 16)
neighbours = [f"{prefix}-{k:x}" for k in range(max(0, n - 8), n + 9) if k != n]

def raw(method, target, body=b"{}", headers=()):
    # Raw bytes on a socket: no client normalises the target (curl and urllib would).
    try:
        s = socket.create_connection((door_host, door_port), timeout=10)
        head = (f"{method} {target} HTTP/1.1\r\nHost: {door_host}:{door_port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n")
        s.sendall(head.encode() + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        s.close()
        return int(data.split(b" ", 2)[1]) if data else 0
    except OSError as e:
        return type(e).__name__

SPELLINGS = [
    "/ng-rollout/../v1/chat/completions", "/ng-rollout/%2e%2e/v1/chat/completions",
    "/ng-rollout/%2E%2E/v1/responses", "/ng-rollout/.%2e/v1/messages",
    "/ng-rollout/./../v1/chat/completions", "/ng-rollout//../v1/chat/completions",
    f"/ng-rollout/{rollout}/../../v1/chat/completions",
    f"/ng-rollout/{rollout}/v1/../../../v1/chat/completions",
    "/ng-rollout/..%2fv1/chat/completions", "/ng-rollout/..%2Fv1/chat/completions",
    "/ng-rollout/..%5cv1/chat/completions", "/ng-rollout/..\\v1/chat/completions",
    "//v1/chat/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages",
    f"{door}/v1/chat/completions", f"{door}/ng-rollout/../v1/chat/completions",
    f"/ng-rollout/{rollout}/v1/chat/completions?x=1",
    f"/ng-rollout/{rollout}/v1/chat/completions/.",
]
spellings, forged, methods = Counter(), Counter(), Counter()
for other in neighbours:
    by_body = json.dumps({"model": "m", "messages": [],
                          "metadata": {"vf_nemogym_route": other, "vf_nemogym_secret": "x"}})
    by_header = (("X-VF-NeMoGym-Route", other), ("Authorization", "Bearer x"))
    for target in SPELLINGS:
        spellings[raw("POST", target, by_body.encode())] += 1
        spellings[raw("POST", target, headers=by_header)] += 1
    for cred in (credential, "0" * 32, credential[::-1]):
        target = f"/ng-rollout/{other}.{cred}/v1/chat/completions"
        forged[raw("POST", target, by_body.encode(), by_header)] += 1
    for method in ("GET", "PUT", "DELETE", "OPTIONS"):
        target = f"/ng-rollout/{rollout}/v1/chat/completions"
        methods[raw(method, target, by_body.encode(), by_header)] += 1

async def scan(host, ports):
    gate = asyncio.Semaphore(4096)
    async def one(port):
        async with gate:
            try:
                _, w = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
            except (OSError, asyncio.TimeoutError):
                return None
            w.close()
            return port
    return sorted(p for p in await asyncio.gather(*(one(p) for p in ports)) if p)

async def scans():
    # Every port a process of the host listens on (any process, any address; the stack's
    # included) and the ports around the door's, at the gateway and at each of the host's other
    # addresses; the stack's ports at the container's own loopback.
    wanted = sorted({*args["host_ports"], *args["stack_ports"],
                     *range(max(1, door_port - 64), min(65536, door_port + 65))})
    return {
        "gateway": await scan(door_host, wanted),
        "addresses": {a: await scan(a, wanted) for a in args["addresses"] if a != door_host},
        "loopback": await scan("127.0.0.1", args["stack_ports"]),
    }

out = {
    "base": base, "neighbours": len(neighbours), "door_port": door_port,
    "spellings": dict(spellings), "forged": dict(forged), "methods": dict(methods),
    "docker_socket": [p for p in ("/var/run/docker.sock", "/run/docker.sock") if os.path.exists(p)],
    **asyncio.run(scans()),
    "routes": open("/proc/net/route").read().split("\n")[1:],
}
print("PROBE" + json.dumps(out))
"""


def listening_ports(entry: str | None = None) -> list[int]:
    """TCP ports that processes carrying `entry` (a stack's marker) listen on, any address;
    without `entry`, every port any process of this host listens on."""
    inodes = set()
    for pid in processes_with_env(entry) if entry is not None else []:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and (entry is None or fields[9] in inodes):
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def host_addresses() -> list[str]:
    """This host's own IPv4 addresses but loopback (docker0's gateway, other stacks' gateways,
    its interfaces): addresses of this machine only."""
    import subprocess

    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True)
    found = [line.split()[3].split("/")[0] for line in out.stdout.splitlines()]
    return [a for a in found if not a.startswith("127.")]


@pytest.fixture(scope="module")
async def held(nemo_venv_07: NeMoGymVenv, kit: TaskKit) -> AsyncIterator[HeldStack]:
    """One shared stack of swebench_pro's pairing for the tests that run rollouts in this
    process; afterwards no process and no container of it is left."""
    options = {**_flags(nemo_venv_07), "config_paths": config_paths(kit, ("swebench_pro",))}
    rows = str(kit.task("swebench_pro").rows)
    agent = kit.task("swebench_pro").agent
    async with hold_shared_stack(**options, jsonl_path=rows, agent=agent) as held:
        yield held
    assert stack_containers(held.marker) == []


def _env(kit: TaskKit, runtime: NeMoGymVenv, rows: Path, **extra: Any) -> Any:
    return nemo_gym_env.load_environment(
        config_paths=config_paths(kit, ("swebench_pro",)),
        jsonl_path=str(rows),
        agent=kit.task("swebench_pro").agent,
        **_flags(runtime),
        **extra,
    )


NEIGHBOURS_WAIT = 30
"""Seconds the neighbours' commands wait before their fix: their routes are open while the
hostile rollout's code tries them."""


async def test_the_code_the_model_writes_reaches_only_its_own_route(
    nemo_venv_07: NeMoGymVenv, kit: TaskKit, tmp_path: Path
) -> None:
    """A hostile rollout among two concurrent neighbours on a private stack (where a refusal
    charged to a named route once failed them): its command, run by OpenCode in its container,
    sends raw bytes to the door with every path spelling (dot segments raw and encoded, encoded
    slashes and backslashes, doubled slashes, plain routes, absolute-form targets, a query)
    naming each neighbour's route id (header and body) with forged secrets, forged path
    credentials and other methods, then tries every port a process of the host listens on (and
    the door's neighbouring ports) at the gateway and at the host's other addresses, the
    stack's ports at loopback, and the docker socket.
    Everything but its own route is 404, 401 or closed; the neighbours score exactly as the
    fixer's case says (1.0, 0.0), and the hostile rollout, fixing its task after the probe,
    1.0. The network is internal, without traffic between containers, and the host firewall
    drops all but the door."""
    cases = [("swebench_pro", True), ("swebench_pro", True), ("swebench_pro", False)]
    table = case_rows(kit, cases, tmp_path / "rows.jsonl")
    table[1:] = [
        replace(
            t, fix=f"sleep {NEIGHBOURS_WAIT}; {t.fix}", wrong=f"sleep {NEIGHBOURS_WAIT}; {t.wrong}"
        )
        for t in table[1:]
    ]
    env = _env(kit, nemo_venv_07, tmp_path / "rows.jsonl", shared_stack=False)
    async with FixerPolicy(tasks=table, wrong=wrong_cases(cases)) as policy, env.serving():
        assert env.start_error is None, env.start_error
        marker = env.stack_marker
        assert marker is not None
        network = f"{docker.NETWORK_PREFIX}{marker[:12]}"
        info = json.loads(
            docker.run_docker("network", "inspect", "--format", "{{json .}}", network)
        )
        gateway = info["IPAM"]["Config"][0]["Gateway"]
        rules = [r for r in _iptables_input() if f"vf-nemogym.stack={marker}" in r]
        stack_ports = listening_ports(f"{MARKER_ENV_VAR}={marker}")
        assert len(stack_ports) >= 4, stack_ports  # head, agent, resources, environment, Ray
        probe_args = {
            "stack_ports": stack_ports,
            "host_ports": listening_ports(),
            "addresses": host_addresses(),
        }
        assert gateway in probe_args["addresses"]
        script = base64.b64encode(PROBE.encode()).decode()
        encoded = base64.b64encode(json.dumps(probe_args).encode()).decode()
        command = (
            f"echo {script} | base64 -d > /tmp/probe.py && python3 /tmp/probe.py {encoded}"
            f"; {table[0].fix}"
        )
        policy.tasks[0] = replace(table[0], fix=command)
        episodes = await asyncio.gather(
            *(env.run_episode(task, model_context(policy)) for task in env.taskset)
        )
    traces = [t.model_dump(mode="json") for episode in episodes for t in episode.traces]
    outcomes = [(case_of(t, table), t["errors"], t["rewards"]) for t in traces]
    hostile = next((c for c in policy.log if c.step == "final" and c.task == 0), None)
    assert hostile is not None, outcomes  # its command's output came back to the model
    tool = next(m for m in hostile.body["messages"] if m.get("role") == "tool")
    content = tool["content"] if isinstance(tool["content"], str) else json.dumps(tool["content"])
    assert "PROBE" in content, content[-3000:]
    found = json.loads(content[content.index("PROBE") + 5 :].split("\n")[0])
    # The neighbours, in flight while the probe named their routes, score as their cases say;
    # the hostile rollout's own route still works (its fix after the probe scores).
    assert len(traces) == len(cases)
    for trace in traces:
        case = case_of(trace, table)
        expected = 1.0 if cases[case][1] else 0.0
        assert not trace["errors"], (case, trace["errors"], found)
        assert trace["rewards"]["nemo_gym"]["score"] == expected, (case, trace["rewards"], found)
    assert f"http://{gateway}:" in found["base"] and "/ng-rollout/" in found["base"]
    assert found["neighbours"] >= 2
    # Every spelling is 404 at the door, a forged credential 401 at the proxy, other methods 404.
    assert set(found["spellings"]) == {"404"}, found["spellings"]
    assert set(found["forged"]) == {"401"}, found["forged"]
    assert set(found["methods"]) == {"404"}, found["methods"]
    # Nothing answers but the door: at the gateway and at the host's other addresses, every
    # port a process of the host listens on; at loopback the stack's ports.
    assert found["gateway"] == [found["door_port"]], found["gateway"]
    assert all(v == [] for v in found["addresses"].values()), found["addresses"]
    assert len(found["addresses"]) >= 1 and found["loopback"] == [], found
    assert found["docker_socket"] == []
    # Routes: the container's subnet, and its one gateway is the host's address on it.
    routes = [line.split() for line in found["routes"] if len(line.split()) > 2]
    gateways = {fields[2] for fields in routes if fields[2] != "00000000"}
    assert gateways == {"".join(f"{int(p):02X}" for p in reversed(gateway.split(".")))}, routes
    assert info["Internal"] is True
    assert info["Options"]["com.docker.network.bridge.enable_icc"] == "false"
    assert any("-j DROP" in r for r in rules) and any("-j ACCEPT" in r for r in rules), rules
    assert stack_containers(marker) == []


IPTABLES = shutil.which("iptables") or "iptables"


def _iptables_input() -> list[str]:
    import subprocess

    return subprocess.run(
        [IPTABLES, "-S", "INPUT"], capture_output=True, text=True, check=True
    ).stdout.splitlines()


# CI: train mode from inside a sandbox, through the door, on OpenSandbox (test_opensandbox.py)
@pytest.mark.survey
async def test_train_mode_records_token_ids_of_every_call_from_the_container(
    nemo_venv_07: NeMoGymVenv, kit: TaskKit, held: HeldStack, tmp_path: Path
) -> None:
    """verifiers' train client: OpenCode's streamed Chat Completions calls, made from inside
    the task's container, reach the train client with token ids, mask and logprobs, every one."""
    case_rows(kit, [("swebench_pro", True), ("swebench_pro", True)], tmp_path / "rows.jsonl")
    env = _env(kit, nemo_venv_07, tmp_path / "rows.jsonl")
    await check_train_episodes(env, held)


FORK_BOMB = r"""
import os, time
forked = 0
while forked < 100000:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    forked += 1
time.sleep(600)
"""


def pids_in_container(container: str) -> int:
    """The processes (and threads) the container's pids cgroup counts now (cgroup v1 or v2,
    docker's cgroupfs or systemd driver)."""
    root = Path("/sys/fs/cgroup")
    for folder in (root / "pids" / "docker" / container,
                   root / "pids" / "system.slice" / f"docker-{container}.scope",
                   root / "system.slice" / f"docker-{container}.scope"):  # fmt: skip
        if (folder / "pids.current").exists():
            return int((folder / "pids.current").read_text())
    raise AssertionError(f"no pids cgroup for container {container}")


async def test_a_rollout_deadline_is_an_error_and_its_container_goes_at_once(
    nemo_venv_07: NeMoGymVenv, kit: TaskKit, held: HeldStack, tmp_path: Path
) -> None:
    """The model's command forks until the container's pids limit refuses, then outlives the
    rollout's deadline: the container carries every bound (`docker inspect`), the fork bomb
    stops at the limit, the rollout is an error (never a reward) naming the deadline, and the
    container is gone within seconds of it, its stack still up."""
    (task,) = case_rows(kit, [("swebench_pro", True)], tmp_path / "rows.jsonl")
    bomb = base64.b64encode(FORK_BOMB.encode()).decode()
    slow = replace(task, fix=f"echo {bomb} | base64 -d > /tmp/bomb.py && python3 /tmp/bomb.py")
    env = _env(kit, nemo_venv_07, tmp_path / "rows.jsonl", task={"run_timeout": 90.0})
    async with FixerPolicy(tasks=[slow]) as policy, env.serving():
        assert held.owns(env)
        rollout = asyncio.ensure_future(
            env.run_episode(next(iter(env.taskset)), model_context(policy))
        )
        (short,) = await until(lambda: stack_containers(held.marker), 60, "the container", 0.5)
        info = json.loads(docker.run_docker("inspect", "--format", "{{json .}}", short))
        limits, config = info["HostConfig"], info["Config"]
        assert limits["PidsLimit"] == 1024, limits["PidsLimit"]
        assert {"CAP_NET_RAW", "CAP_MKNOD", "CAP_SYS_CHROOT"} <= set(limits["CapDrop"]), limits
        assert "no-new-privileges" in limits["SecurityOpt"], limits["SecurityOpt"]
        assert limits["AutoRemove"] is True and config["Cmd"][-1] == "sleep 3600", config["Cmd"]
        assert {docker.BOOT_LABEL, docker.PIDNS_LABEL} <= set(config["Labels"])
        before = len(os.listdir("/proc"))
        full = await until(
            lambda: (n := pids_in_container(info["Id"])) >= 1000 and n, 80, "the fork bomb", 0.5
        )
        await asyncio.sleep(2)  # the bomb has stopped at the limit, not slowed down
        assert full <= pids_in_container(info["Id"]) <= 1024
        assert len(os.listdir("/proc")) - before < 1024 + 300  # other helpers' processes
        episode = await rollout
        ended = asyncio.get_running_loop().time()
        await until(lambda: not stack_containers(held.marker), 20, "the container to go", 0.5)
        gone_after = asyncio.get_running_loop().time() - ended
    await held.released()
    assert not episode.ok
    assert "did not return within 90 s" in json.dumps(episode.traces[0].errors[0].message)
    assert "nemo_gym" not in episode.traces[0].rewards
    assert gone_after < 20


@contextlib.asynccontextmanager
async def eval_in_its_container(
    kit: TaskKit, runtime: NeMoGymVenv, rows: Path, out: Path, *extra: str
) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """A vf-eval of `rows` (one swebench_pro case) on a private stack whose model's command is
    `sleep 600`, with `extra` config paths: its run tag and process once the command runs in
    the rollout's container; killed and reaped on the way out if still running."""
    (task,) = case_rows(kit, [("swebench_pro", True)], rows)
    async with FixerPolicy(tasks=[replace(task, fix="sleep 600")]) as policy:
        cmd = vf_eval_command(
            "policy", policy.base_url, "FIXER_KEY", 1, 1, 1, out,
            "--env.taskset.config-paths",
            json.dumps([*config_paths(kit, ("swebench_pro",)), *extra]),
            "--env.taskset.jsonl-path", str(rows),
            "--env.taskset.shared-stack", "false",
            *runtime_flags(runtime),
        )  # fmt: skip
        tag, environ = run_tag(FIXER_KEY="unused")
        proc = await asyncio.create_subprocess_exec(
            *cmd, env=environ, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        try:
            await until(lambda: any(c.step == "fix" for c in policy.log), 900, out.name)
            yield tag, proc
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


# CI SIGKILLs the env process (its stack's supervisor removes what it left); the Ctrl-C, the
# stack's own stop that every other container test here ends with, is surveyed.
@pytest.mark.parametrize(
    "how",
    [signal.SIGKILL, pytest.param(signal.SIGINT, marks=pytest.mark.survey)],
    ids=lambda s: s.name,
)
async def test_ctrl_c_or_sigkill_of_the_env_process_leaves_no_container(
    nemo_venv_07: NeMoGymVenv, kit: TaskKit, tmp_path: Path, how: signal.Signals
) -> None:
    """A vf-eval with a private stack, interrupted (Ctrl-C) or SIGKILLed while its rollout's
    container runs the model's command: no container, network or process of it is left (the
    stack's supervisor removes them; a start after a killed one sweeps what remains)."""
    before = set(stack_containers())
    rows, out = tmp_path / f"{how.name}.jsonl", tmp_path / how.name
    async with eval_in_its_container(kit, nemo_venv_07, rows, out) as (tag, proc):
        assert set(stack_containers()) - before  # a rollout's container runs
        os.kill(proc.pid, how)
        await asyncio.wait_for(proc.wait(), 120)
    assert await gone(tag) == []
    left = await until(
        lambda: not (set(stack_containers()) - before) or None, 60, "the containers to go"
    )
    assert left


LIFETIME = 60
"""The containers' lifetime (NeMo Gym's `sandbox_config.ttl_s`) in the run whose every process
is SIGKILLed: the bound within which they go with no owner left."""


def short_lifetime(path: Path) -> Path:
    """An override config giving swebench_pro's containers a `LIFETIME` s lifetime."""
    path.write_text(
        "swebench_pro_opencode_resources_server:\n  resources_servers:\n    swebench_pro:\n"
        f"      sandbox_config:\n        ttl_s: {LIFETIME}\n"
        "swebench_pro_opencode_sandboxed_agent:\n  responses_api_agents:\n"
        f"    opencode_sandboxed_agent:\n      sandbox_config:\n        ttl_s: {LIFETIME}\n"
    )
    return path


def unheld(workdir: Path) -> bool:
    """Whether `workdir`'s lock file exists and no stack holds it (its stack is gone)."""
    if not (workdir / WORKDIR_LOCK).is_file():
        return False  # a stack making it right now
    handle = try_flock(workdir / WORKDIR_LOCK)
    if handle is not None:
        handle.close()
    return handle is not None


def kill_every_process(entry: str) -> tuple[str, list[Path]]:
    """SIGKILL every process carrying `entry` (a run's tag) until none is left (bounded
    rounds: a process may start one while being killed); the stack marker its supervisor had
    and the folders it was to remove were its owner to die (the Ray temp folder, the workdir)."""
    from verifiers_nemogym.nemo.supervisor import argv_of

    marker, folders = "", list[Path]()
    for _ in range(50):
        pids = processes_with_env(entry)
        if not pids:
            return marker, folders
        for pid in pids:
            argv = argv_of(pid)
            if "--marker" in argv:
                marker = argv[argv.index("--marker") + 1]
                folders = [Path(v) for k, v in pairwise(argv) if k == "--remove-if-orphaned"]
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    raise AssertionError(f"processes of {entry} still start after 50 rounds of SIGKILL")


def _keepers(marker: str) -> str:
    """What keeps the sweep off the stack of `marker`: the live processes carrying it (in
    their environment or on their command line) and its networks' live makers."""
    from verifiers_nemogym.nemo.supervisor import alive, argv_of, environ_of, pids

    entry = f"{MARKER_ENV_VAR}={marker}".encode()
    carriers = [
        f"{pid} {' '.join(argv_of(pid))[:200]!r}"
        for pid in pids()
        if entry in environ_of(pid) or marker in " ".join(argv_of(pid))
    ]
    stack = docker._stack_markers().get(marker) or docker._Stack(set(), set())
    owners = [f"{o} {' '.join(argv_of(o))[:200]!r}" for o, t in stack.owners if alive(o, t)]
    here = docker.origin()
    return f"carried by {carriers}; live makers {owners}; origins {stack.origins} (here {here})"


async def test_a_run_killed_whole_leaves_containers_that_end_within_their_lifetime(
    nemo_venv_07: NeMoGymVenv, kit: TaskKit, tmp_path: Path
) -> None:
    """Every process of a vf-eval run (vf-eval, the stack's supervisor, NeMo Gym's servers,
    Ray) SIGKILLed at once while its rollout's container runs the model's command: the
    container, still there seconds later (nothing removed it), is gone within its lifetime
    (`ttl_s`, here 60 s: `docker run --rm` with a `sleep` keepalive) with nothing of the run
    alive and no other start; the next start's sweep removes the network and firewall rules."""
    lifetime = str(short_lifetime(tmp_path / "lifetime.yaml"))
    rows, out = tmp_path / "rows.jsonl", tmp_path / "out"
    async with eval_in_its_container(kit, nemo_venv_07, rows, out, lifetime) as (tag, _):
        marker, folders = kill_every_process(tag)
        killed = asyncio.get_running_loop().time()
    assert marker and processes_with_env(tag) == []
    # Nothing of the run was left to remove its folders: a later start prunes them, a day on
    # for its workdir (its log), and at once, as here, for its Ray temp folder (token, sockets).
    ray_tmpdir, workdir = folders
    assert ray_tmpdir.name.startswith(RAY_TMPDIR_PREFIX) and workdir.name.startswith(WORKDIR_PREFIX)
    assert ray_tmpdir in prune_stale_workdirs(Path("/tmp"), 0, prefix=RAY_TMPDIR_PREFIX)
    assert workdir.is_dir() and unheld(workdir)
    shutil.rmtree(workdir)  # this test's own doing: not left for a day
    (container,) = stack_containers(marker)
    await asyncio.sleep(3)
    assert stack_containers(marker) == [container], "gone before its lifetime: not the bound"
    await until(lambda: not stack_containers(marker), LIFETIME + 30, "its lifetime", 0.5)
    assert asyncio.get_running_loop().time() - killed < LIFETIME + 30
    assert marker in docker._stack_markers()  # its network, left for a sweep
    # A sweep removes it: this one, or one of a stack starting meanwhile in the other test
    # worker (every start sweeps; while it removes, its docker commands name the marker, which
    # keeps ours off). One that could not (docker still holding the container's endpoint)
    # leaves it to the next: sweeps are run until it is gone, a minute at most.
    gone_by = asyncio.get_running_loop().time() + 60
    while marker in docker._stack_markers():
        assert asyncio.get_running_loop().time() < gone_by, f"not swept: {_keepers(marker)}"
        if marker not in await asyncio.to_thread(docker.sweep_dead_stacks):
            await asyncio.sleep(0.5)
    assert not [r for r in _iptables_input() if marker in r]


async def test_what_the_machine_cannot_give_is_one_line_before_any_rollout(
    nemo_venv_07: NeMoGymVenv, kit: TaskKit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image no daemon has, a CPU request above the host, and no docker daemon at all: every
    rollout is an error whose one line names the row and image, the server and key, or the
    daemon; no model call is made and no container is left."""
    (task,) = case_rows(kit, [("swebench_pro", True)], tmp_path / "rows.jsonl")
    row = json.loads((tmp_path / "rows.jsonl").read_text())
    row["dockerhub_tag"] = "not-built-here"
    (tmp_path / "absent.jsonl").write_text(json.dumps(row) + "\n")
    cpus = docker.daemon().cpus
    greedy = tmp_path / "greedy.yaml"
    greedy.write_text(
        "swebench_pro_opencode_resources_server:\n  resources_servers:\n    swebench_pro:\n"
        f"      sandbox_config:\n        resources:\n          cpu: {cpus + 2}\n"
    )

    async def first_error(env: Any) -> str:
        async with FixerPolicy(tasks=[task]) as policy, env.serving():
            episode = await env.run_episode(next(iter(env.taskset)), model_context(policy))
        assert policy.log == [] and not episode.ok
        message = str(episode.traces[0].errors[0].message).strip()
        assert "\n" not in message, message
        return message

    before = set(Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"))
    absent = _env(kit, nemo_venv_07, tmp_path / "absent.jsonl", shared_stack=False)
    message = await first_error(absent)
    assert "absent.jsonl:1" in message and "swebench-pro:not-built-here" in message, message
    assert "docker daemon does not have" in message, message

    env = nemo_gym_env.load_environment(
        config_paths=[*config_paths(kit, ("swebench_pro",)), str(greedy)],
        jsonl_path=str(tmp_path / "rows.jsonl"), shared_stack=False, **_flags(nemo_venv_07),
    )  # fmt: skip
    message = await first_error(env)
    assert "swebench_pro_opencode_resources_server" in message, message
    assert f"sandbox_config.resources.cpu is {cpus + 2}" in message, message
    assert f"daemon has {cpus} CPUs" in message, message

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    message = await first_error(_env(kit, nemo_venv_07, tmp_path / "rows.jsonl"))
    assert "needs a running docker daemon" in message, message
    monkeypatch.undo()
    # A start that failed before NeMo Gym ran has no log to keep: no workdir of it is left.
    # (Only such folders are counted: a stack of the other test worker has its lock taken or
    # a log, and may come and go meanwhile.)
    now = set(Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"))
    left = [w for w in now - before if not (w / "ng_run.log").exists() and unheld(w)]
    assert left == [], left
    assert stack_containers() == [] or all(
        processes_with_env(f"{MARKER_ENV_VAR}={m}") for m in docker._stack_markers()
    )


def test_a_start_sweeps_what_a_dead_stack_left(kit: TaskKit) -> None:
    """Containers, networks and firewall rules of a stack whose processes are all gone (its
    starter and supervisor SIGKILLed together) are removed by the next stack's sweep; those of a
    stack with a live process stay. A sweep from another PID namespace on the same daemon (a CI
    job container given the host's docker socket), which sees none of their processes, proves
    neither dead and touches neither."""
    import subprocess
    import uuid

    dead, live = uuid.uuid4().hex, uuid.uuid4().hex
    image = kit.task("swebench_pro").image
    origins = [arg for label in docker.origin_labels() for arg in ("--label", label)]
    for marker in (dead, live):
        label = f"{STACK_LABEL}={marker}"
        docker.run_docker(
            "network", "create", "--internal", "--label", label, *origins, f"vfng-t{marker[:8]}"
        )
        docker.run_docker(
            "run", "-d", "--label", label, *origins, "--entrypoint", "sleep", image, "600"
        )  # fmt: skip
    rule = ["INPUT", "-i", f"vfng{dead[:11]}", "-m", "comment", "--comment",
            f"{STACK_LABEL}={dead}", "-j", "DROP"]  # fmt: skip
    subprocess.run(["iptables", "-I", *rule], check=True)
    keeper = subprocess.Popen(["sleep", "600"], env={**os.environ, MARKER_ENV_VAR: live})
    try:
        sweep = "from verifiers_nemogym.containers import docker; print(docker.sweep_dead_stacks())"
        elsewhere = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", sweep],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        assert elsewhere.stdout.strip() == "[]", elsewhere.stdout
        assert len(stack_containers(live)) == 1 and len(stack_containers(dead)) == 1
        swept = docker.sweep_dead_stacks()
        assert dead in swept and live not in swept
        assert stack_containers(dead) == [] and len(stack_containers(live)) == 1
        networks = docker.run_docker("network", "ls", "--format", "{{.Name}}").split()
        assert f"vfng-t{live[:8]}" in networks and f"vfng-t{dead[:8]}" not in networks
        assert not [r for r in _iptables_input() if dead in r]
    finally:
        keeper.kill()
        keeper.wait()
        assert live in docker.sweep_dead_stacks()
    assert stack_containers(live) == []


def test_a_sweep_keeps_the_network_of_a_stack_still_starting() -> None:
    """Two stacks starting at once: the network one made before its processes run (its
    supervisor comes after the network and the door) is not a dead stack's for the other's
    sweep while the process that made it lives; once that process is gone it is."""
    import subprocess
    import uuid

    starting, orphaned = uuid.uuid4().hex, uuid.uuid4().hex
    docker.ContainerNetwork.create(starting)  # made by this process, which lives on
    maker = (
        "import sys; from verifiers_nemogym.containers import docker; "
        "docker.ContainerNetwork.create(sys.argv[1])"
    )
    subprocess.run([sys.executable, "-c", maker, orphaned], check=True, timeout=120)
    try:
        swept = docker.sweep_dead_stacks()
        assert starting not in swept and orphaned in swept
        assert (
            f"{docker.NETWORK_PREFIX}{starting[:12]}"
            in docker.run_docker("network", "ls", "--format", "{{.Name}}").split()
        )
    finally:
        docker.remove_objects(f"{STACK_LABEL}={starting}")
        docker.remove_objects(f"{STACK_LABEL}={orphaned}")


REUSED_PID = """
import os, subprocess, sys
from verifiers_nemogym.containers import docker
make = "import os, sys; from verifiers_nemogym.containers import docker; "
make += "docker.ContainerNetwork.create(sys.argv[1]); print(os.getpid())"
marker = os.environ["SWEPT_MARKER"]  # not on a command line: that would read as a live stack
maker = int(subprocess.run([sys.executable, "-c", make, marker], check=True, text=True,
                           capture_output=True, timeout=120).stdout)
with open("/proc/sys/kernel/ns_last_pid", "w") as handle:
    handle.write(str(maker - 1))
reuser = subprocess.Popen(["sleep", "120"])
try:
    print(reuser.pid == maker, marker in docker.sweep_dead_stacks())
finally:
    reuser.kill()
"""


def test_a_sweep_takes_a_dead_makers_network_when_its_pid_was_given_to_another_process() -> None:
    """In a PID namespace of its own (so the next PID can be chosen: `ns_last_pid`), a process
    makes a stack's network and exits, and a `sleep` is given its PID: the sweep sees the maker
    is gone (its PID now names a process that started later) and removes the network."""
    import subprocess
    import uuid

    marker = uuid.uuid4().hex
    try:
        done = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", REUSED_PID],
            capture_output=True, text=True, timeout=180, env={**os.environ, "SWEPT_MARKER": marker},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == ["True", "True"], done.stdout
    finally:
        docker.remove_objects(f"{STACK_LABEL}={marker}")


def path_without_iptables(folder: Path) -> str:
    """A PATH of links to every command of this one but `iptables*`."""
    folder.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        with contextlib.suppress(OSError):
            for entry in os.scandir(directory):
                link = folder / entry.name
                if not entry.name.startswith("iptables") and not link.exists():
                    link.symlink_to(entry.path)
    return str(folder)


async def test_without_iptables_the_stack_refuses_unless_opted_in_and_then_says_so(
    nemo_venv_07: NeMoGymVenv,
    kit: TaskKit,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """iptables off PATH (the docker firewall cannot be made): every rollout is an error whose
    one line names what is missing and the option, no model call is made and no stack starts;
    with `allow_unisolated_containers` a private stack runs, scores, and one warning says the
    containers are unisolated and what they reach, and no firewall rule is made."""
    import logging

    (task,) = case_rows(kit, [("swebench_pro", True)], tmp_path / "rows.jsonl")
    monkeypatch.setenv("PATH", path_without_iptables(tmp_path / "bin"))
    before = set(docker._stack_markers())
    refused = _env(kit, nemo_venv_07, tmp_path / "rows.jsonl", shared_stack=False)
    async with FixerPolicy(tasks=[task]) as policy, refused.serving():
        episode = await refused.run_episode(next(iter(refused.taskset)), model_context(policy))
    assert policy.log == [] and not episode.ok
    message = str(episode.traces[0].errors[0].message).strip()
    assert "\n" not in message and "cannot isolate the sandbox containers" in message, message
    assert "iptables (not on PATH" in message, message
    assert "--env.taskset.allow-unisolated-containers true" in message, message
    assert set(docker._stack_markers()) == before  # nothing of a stack was made
    caplog.set_level(logging.INFO, logger="verifiers_nemogym")
    env = _env(
        kit, nemo_venv_07, tmp_path / "rows.jsonl", shared_stack=False,
        allow_unisolated_containers=True,
    )  # fmt: skip
    async with FixerPolicy(tasks=[task]) as policy, env.serving():
        episode = await env.run_episode(next(iter(env.taskset)), model_context(policy))
        rules = [r for r in _iptables_input() if "vf-nemogym.stack=" in r]
    assert episode.ok and episode.traces[0].reward == 1.0, [t.errors for t in episode.traces]
    warned = [r.getMessage() for r in caplog.records if "run UNISOLATED" in r.getMessage()]
    # One warning per start (a start Ray timed out on is tried again, and warns again).
    assert warned and set(warned) == {warned[0]}, warned
    assert "missing iptables (not on PATH" in warned[0], warned
    assert "reach every service this host" in warned[0]
    joined = re.search(
        r"join docker network (vfng-\w+) .* they reach the door, and whatever", caplog.text
    )
    assert joined is not None, caplog.text[-2000:]
    prefix = joined.group(1).removeprefix(docker.NETWORK_PREFIX)
    assert not [r for r in rules if f"vf-nemogym.stack={prefix}" in r], rules
