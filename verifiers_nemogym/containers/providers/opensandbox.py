"""NeMo Gym's `opensandbox` sandbox provider on a stack of ours (docs/containers.md).

NeMo Gym's own `OpenSandboxProvider` (its `nemo-gym[sandbox]` client, added to the servers'
venvs by `sandbox.shadow_servers`) creates and drives the sandboxes through an OpenSandbox server;
this module is what the stack does around it:
- `check`: before any rollout, a one-line error naming the provider when sandboxes it cannot
  isolate are not opted into (`allow_unisolated_containers`), when the provider config's
  `connection.domain` / `connection.api_key` (NeMo Gym reads `OPENSANDBOX_DOMAIN` and
  `OPENSANDBOX_API_KEY`) are unset, or when the server does not answer `GET /health` or
  refuses the key.
- `prepare`: metadata `vf-nemogym/stack=<marker>` on every sandbox (the provider block's
  `default_metadata`, which NeMo Gym merges into each sandbox's metadata and OpenSandbox turns
  into labels), and the door's bind address: `$VF_NEMOGYM_DOOR_HOST`, else docker's default
  bridge gateway (where the server's docker runtime puts sandboxes).
- `stop` deletes the stack's sandboxes through the server's API (listed by that metadata); the
  stack's supervisor does it again once the stack's servers are gone (`python -m` this module
  `--stop <marker>`, reading `STOP_FILE` in the stack's folder), so a SIGKILLed owner leaves no
  sandbox either; `sweep` deletes those of stacks whose processes are all gone.
The API key is sent only in the `OPEN-SANDBOX-API-KEY` header, never logged or put in an error.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from verifiers_nemogym.containers.providers import ACCEPT_RISK, DOOR_HOST_ENV, Prepared
from verifiers_nemogym.containers.sandbox import SandboxPlan, stack_config
from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR, processes_with_env
from verifiers_nemogym.util import run_checked

logger = logging.getLogger(__name__)

NAME = "opensandbox"
STACK_KEY = "vf-nemogym/stack"
"""Sandbox metadata key (a Kubernetes label key) naming the stack that made a sandbox."""
API_KEY_HEADER = "OPEN-SANDBOX-API-KEY"
API_TIMEOUT = 30.0
"""Seconds one call to the server's lifecycle API may take."""
HEALTH_TIMEOUT = 5.0
"""Seconds each call of `health` may take: it holds a failed rollout's error, and a server that
takes longer than this to say it is healthy is as good as gone for that error's purpose."""
PAGE_SIZE = 200
STOP_FILE = "vf_nemogym_opensandbox.json"
"""In the stack's folder: how the supervisor's `--stop` reaches the server (the connection's
`domain`, `protocol` and `api_key` as the config spells them; a key only as an `${oc.env:...}`
reference, resolved from the supervisor's environment, never the key itself)."""
_ENV_REF = re.compile(r"^\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(?:,(.*))?\}$", re.S)


def resolve(value: Any) -> str | None:
    """A config value as NeMo Gym resolves it: `${oc.env:NAME}` / `${oc.env:NAME,default}`
    from the environment; None when unset (or empty)."""
    if isinstance(value, str) and (found := _ENV_REF.match(value.strip())):
        value = os.environ.get(found.group(1), found.group(2))
    return str(value) if value not in (None, "") else None


@dataclass(frozen=True)
class Server:
    """An OpenSandbox server's lifecycle API: `base_url` (scheme, host, port) and its key."""

    base_url: str
    api_key: str
    timeout: float = API_TIMEOUT
    """Seconds one call may take."""

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> Server:
        """From the provider's settings (`connection.domain`, `protocol`, `api_key`);
        ConfigError (one line) naming what is unset."""
        connection = settings.get("connection") or {}
        domain = resolve(connection.get("domain"))
        key = resolve(connection.get("api_key"))
        if domain is None:
            raise ConfigError(
                "NeMo Gym's opensandbox sandbox provider has no server: set OPENSANDBOX_DOMAIN "
                "(sandbox.opensandbox.connection.domain)"
            )
        if key is None:
            raise ConfigError(
                "NeMo Gym's opensandbox sandbox provider has no API key: set "
                "OPENSANDBOX_API_KEY (sandbox.opensandbox.connection.api_key)"
            )
        if "://" not in domain:
            domain = f"{resolve(connection.get('protocol')) or 'http'}://{domain}"
        return cls(base_url=domain.rstrip("/"), api_key=key)

    async def _call(self, method: str, path: str) -> Any:
        """The JSON of `method path` (None for an empty body); StackError (one line, naming the
        provider and server) if the server does not answer or fails, ConfigError on 401/403."""
        url = f"{self.base_url}{path}"
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.request(method, url, headers={API_KEY_HEADER: self.api_key}) as response,
            ):
                body = await response.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise StackError(
                f"the OpenSandbox server at {self.base_url} (NeMo Gym's opensandbox sandbox "
                f"provider) does not answer: {type(e).__name__}: {e}"
            ) from None
        if response.status in (401, 403):
            raise ConfigError(
                f"the OpenSandbox server at {self.base_url} refused the API key "
                f"(OPENSANDBOX_API_KEY): HTTP {response.status}"
            )
        if response.status >= 400:
            raise StackError(
                f"the OpenSandbox server at {self.base_url} answered {method} {path.split('?')[0]} "
                f"with HTTP {response.status}: {body[:200].decode(errors='replace')}"
            )
        return None if not body.strip() else _json(body)

    async def check(self) -> None:
        """The server is healthy and accepts the key (one list call)."""
        health = await self._call("GET", "/health")
        if not isinstance(health, dict) or health.get("status") != "healthy":
            raise StackError(f"the OpenSandbox server at {self.base_url} is not healthy: {health}")
        await self._call("GET", "/v1/sandboxes?pageSize=1")

    async def sandboxes(self, marker: str | None = None) -> list[dict[str, Any]]:
        """Every sandbox carrying `STACK_KEY` (with value `marker` when given), all pages."""
        query = f"&metadata={quote(f'{STACK_KEY}={marker}', safe='')}" if marker else ""
        found: list[dict[str, Any]] = []
        for page in range(1, 1000):
            listed = await self._call(
                "GET", f"/v1/sandboxes?pageSize={PAGE_SIZE}&page={page}{query}"
            )
            items = listed.get("items") or [] if isinstance(listed, dict) else []
            found += [i for i in items if STACK_KEY in (i.get("metadata") or {})]
            if len(items) < PAGE_SIZE:
                break
        return found

    async def delete(self, sandbox_id: str) -> None:
        """Delete one sandbox (gone already is fine)."""
        try:
            await self._call("DELETE", f"/v1/sandboxes/{quote(sandbox_id, safe='')}")
        except StackError as e:
            if "HTTP 404" not in str(e):
                raise


async def health(settings: dict[str, Any]) -> str | None:
    """None while the OpenSandbox server of the provider's `settings` is healthy and takes the
    key; else one line naming it and what fails (asked when a rollout's `/run` fails, so that
    the rollout's error says the provider went away, not only what the agent made of it). Each
    call to the server is bounded by `HEALTH_TIMEOUT`."""
    try:
        await replace(Server.from_settings(settings), timeout=HEALTH_TIMEOUT).check()
    except (ConfigError, StackError) as e:
        return str(e)
    return None


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def bridge_gateway() -> str:
    """The host's address on docker's default bridge (where the server's docker runtime puts
    sandboxes): its IPAM gateway, else (docker leaves it out for the default bridge) the
    address of its interface (`docker0` unless the network names another)."""
    docker = shutil.which("docker")
    if docker is None:
        raise StackError(f"no `docker` CLI to find docker's default bridge; set {DOOR_HOST_ENV}")
    inspected = json.loads(
        run_checked([docker, "network", "inspect", "bridge", "--format", "{{json .}}"],
                    "`docker network inspect bridge`", 60)
    )  # fmt: skip
    configs = (inspected.get("IPAM") or {}).get("Config") or []
    gateways = [c["Gateway"] for c in configs if c.get("Gateway")]
    if gateways:
        return str(gateways[0])
    options = inspected.get("Options") or {}
    interface = options.get("com.docker.network.bridge.name") or "docker0"
    try:
        return interface_address(interface)
    except OSError:
        raise StackError(
            f"docker's default bridge names no gateway and {interface} has no IPv4 address; set "
            f"{DOOR_HOST_ENV} to the address the OpenSandbox sandboxes reach this machine at"
        ) from None


def interface_address(name: str) -> str:
    """The IPv4 address of network interface `name` (OSError if it has none)."""
    import fcntl
    import socket
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        packed = fcntl.ioctl(probe.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


class OpenSandbox:
    """The module contract, for the stack of `marker`."""

    name = NAME
    stop_module: str | None = __name__

    def __init__(self, marker: str, log: logging.Logger = logger) -> None:
        self.marker = marker
        self.log = log
        self.server: Server | None = None

    async def check(self, plan: SandboxPlan, *, allow_unisolated: bool) -> None:
        users = ", ".join(s.instance for s in plan.servers if s.provider == NAME)
        if not allow_unisolated:
            raise ConfigError(
                f"{users}: nemo-gym-env cannot isolate NeMo Gym's opensandbox sandboxes (it sets "
                "no network_policy: this server has no egress image tested here); they reach "
                f"what their network allows. To run them unisolated, set {ACCEPT_RISK}"
            )
        server = Server.from_settings(plan.providers[NAME])
        await server.check()
        self.server = server

    async def prepare(self, plan: SandboxPlan, workdir: Path) -> Prepared:
        metadata = {"default_metadata": {STACK_KEY: self.marker}}
        config = {block: metadata for block, p in plan.blocks.items() if p == NAME}
        if any(isinstance(s.settings.get("sandbox_provider"), dict) for s in plan.servers):
            raise ConfigError(
                "an inline opensandbox sandbox_provider block cannot carry the stack's metadata; "
                "name a top-level provider block (NeMo Gym's configs/opensandbox.yaml)"
            )
        host = os.environ.get(DOOR_HOST_ENV) or bridge_gateway()
        (workdir / STOP_FILE).write_text(json.dumps(stop_record(plan.providers[NAME])))
        return Prepared(config=config, door_host=host)

    async def route(
        self, plan: SandboxPlan, door: tuple[str, int] | None, workdir: Path
    ) -> dict[str, Any]:
        return stack_config(plan, label=None, network=None, door=door, workdir=workdir)

    def isolation(self) -> str:
        return (
            "OpenSandbox sandboxes run UNISOLATED (allow_unisolated_containers): no egress "
            "policy is set, so they reach what their network allows besides the door"
        )

    async def sweep(self) -> list[str]:
        assert self.server is not None, "check() first"
        by_stack: dict[str, list[str]] = {}
        for sandbox in await self.server.sandboxes():
            marker = str(sandbox["metadata"][STACK_KEY])
            by_stack.setdefault(marker, []).append(str(sandbox.get("id")))
        swept = []
        for marker, ids in sorted(by_stack.items()):
            if marker == self.marker or processes_with_env(f"{MARKER_ENV_VAR}={marker}"):
                continue
            for sandbox_id in ids:
                await self.server.delete(sandbox_id)
            self.log.info(
                "deleted %d OpenSandbox sandbox(es) of a dead stack (%s)", len(ids), marker
            )
            swept.append(marker)
        return swept

    async def stop(self) -> None:
        if self.server is None:
            return
        for sandbox in await self.server.sandboxes(self.marker):
            await self.server.delete(str(sandbox.get("id")))


def stop_record(settings: dict[str, Any]) -> dict[str, Any]:
    """`STOP_FILE`'s content for the provider's `settings`: the connection's domain and protocol,
    and its api_key only when it is an environment reference."""
    connection = settings.get("connection") or {}
    record = {k: connection[k] for k in ("domain", "protocol") if connection.get(k) is not None}
    key = connection.get("api_key")
    if isinstance(key, str) and _ENV_REF.match(key.strip()):
        record["api_key"] = key
    return {"connection": record}


async def stop_stack(folder: Path, marker: str) -> int:
    """Delete the sandboxes of stack `marker` through the server `folder`'s `STOP_FILE` names;
    how many. ConfigError/StackError (one line, no key) if it cannot."""
    record = json.loads((folder / STOP_FILE).read_text())
    server = Server.from_settings(record)
    listed = await server.sandboxes(marker)
    for sandbox in listed:
        await server.delete(str(sandbox.get("id")))
    return len(listed)


def _main(argv: list[str]) -> int:
    """`python -m` this module `--stop MARKER` (the stack's supervisor, in the stack's folder):
    exit 0 once the stack's sandboxes are deleted, else 1 with one line on stderr."""
    import asyncio
    import sys

    if len(argv) != 2 or argv[0] != "--stop":
        sys.stderr.write("usage: python -m verifiers_nemogym.containers.providers.opensandbox "
                         "--stop MARKER\n")  # fmt: skip
        return 2
    try:
        asyncio.run(stop_stack(Path.cwd(), argv[1]))
    except (ConfigError, StackError, OSError, ValueError) as e:
        sys.stderr.write(f"{e}\n")
        return 1
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(_main(sys.argv[1:]))
