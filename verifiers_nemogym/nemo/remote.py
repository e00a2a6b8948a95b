"""Attach to a NeMo Gym stack started elsewhere, by its head server URL (`--env.taskset.stack-url`).

Contract: `await describe_remote(url, proxy_host, proxy_port)` reads the running stack's merged
config from `GET <url>/global_config_dict_yaml` (parsed by nemo/catalog.py, the one reader of
NeMo Gym config) and returns its agents' base URLs. It raises StackError when the head server
cannot be reached or returns no config, and ConfigError when the stack does not match this env
process: its `policy_model` must be an address this process's model proxy listens on (the proxy
IS the stack's policy model), and agents bound to loopback cannot be used from another host.
Nothing is started or stopped here: the stack belongs to whoever started it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.live import LiveStack
from verifiers_nemogym.nemo.catalog import (
    AGENTS,
    MODELS,
    POLICY_INSTANCE,
    parse_config,
    server_blocks,
)

logger = logging.getLogger(__name__)

_WILDCARD = ("0.0.0.0", "::")


@dataclass(frozen=True)
class RemoteStack:
    """A running stack's head server and agents (instance name -> base URL)."""

    head_url: str
    agents: dict[str, str]
    policy_address: tuple[str, int]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def describe_remote(url: str, proxy_host: str, proxy_port: int) -> RemoteStack:
    """See the module contract. `proxy_port` 0 means "the port the stack's policy_model names"."""
    head_url = url.rstrip("/")
    parts = urlsplit(head_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--env.taskset.stack-url {url!r} is not an http(s) URL of a head server")
    where = f"{head_url}/global_config_dict_yaml"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http,
            http.get(where) as response,
        ):
            if response.status != 200:
                raise StackError(f"NeMo Gym head server {head_url} answered {response.status}")
            # A JSON-encoded YAML string with secrets in clear text: parse it, never log it.
            raw = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        raise StackError(
            f"NeMo Gym head server {head_url} is unreachable ({type(e).__name__}); "
            "is the stack running, and is its head server reachable from this machine?"
        ) from None
    if not isinstance(raw, str):
        raise StackError(f"NeMo Gym head server {head_url} returned no config")
    config = parse_config(raw, where)
    agents: dict[str, str] = {}
    for name, (_, settings) in server_blocks(config, AGENTS).items():
        host, port = settings.get("host"), settings.get("port")
        if not host or not port:
            continue
        if _is_loopback(str(host)) and not _is_loopback(parts.hostname):
            raise ConfigError(
                f"agent {name!r} of the stack at {head_url} listens on {host} of that machine; "
                "start ng_run there with +default_host=<its routable address>"
            )
        agents[name] = f"http://{host}:{port}"
    if not agents:
        raise ConfigError(f"the NeMo Gym stack at {head_url} defines no agent server")
    policy = server_blocks(config, MODELS).get(POLICY_INSTANCE)
    if policy is None or not policy[1].get("host") or not policy[1].get("port"):
        raise ConfigError(
            f"the NeMo Gym stack at {head_url} has no `{POLICY_INSTANCE}` with a host and port; "
            "start it with this env's model proxy address as its policy_model"
        )
    policy_host, policy_port = str(policy[1]["host"]), int(policy[1]["port"])
    matches_host = (
        policy_host == proxy_host
        or proxy_host in _WILDCARD
        or (_is_loopback(policy_host) and _is_loopback(proxy_host))
    )
    if not matches_host or (proxy_port and proxy_port != policy_port):
        raise ConfigError(
            f"the NeMo Gym stack at {head_url} calls its {POLICY_INSTANCE} at "
            f"{policy_host}:{policy_port}, but this env's model proxy would listen on "
            f"{proxy_host}:{proxy_port or policy_port}; set --env.taskset.proxy-host and "
            "--env.taskset.proxy-port to match"
        )
    return RemoteStack(head_url, agents, (policy_host, policy_port))


WATCH_INTERVAL = 5.0
"""Seconds between checks that a remote stack's head server still answers."""


async def watch_remote(stack: RemoteStack, live: LiveStack, misses: int = 3) -> None:
    """Fail every rollout once the remote head server has refused `misses` checks in a row."""
    missed = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            try:
                async with http.get(stack.head_url) as response:
                    await response.read()
                missed = 0
            except aiohttp.ClientConnectorError:
                missed += 1
            except (aiohttp.ClientError, TimeoutError):
                pass  # slow is not dead
            if missed >= misses:
                reason = f"the NeMo Gym stack at {stack.head_url} stopped answering"
                logger.error("%s; remaining rollouts fail", reason)
                live.fail(reason)
                return
