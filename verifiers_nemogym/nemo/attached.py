"""Attach to a NeMo Gym stack started elsewhere (`--env.taskset.stack-url`) by its head server URL.

(A shared stack host's TLS listener, `stack_url` with `--env.taskset.stack-pin`, is
`shared/gate_client.py`'s.) Nothing is started or stopped here: the stack belongs to whoever started
it. What is checked: docs/shared-stacks.md, "A stack started elsewhere".
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.nemo.catalog import (
    AGENTS,
    MODELS,
    POLICY_INSTANCE,
    run_targets,
    server_blocks,
    server_urls,
)
from verifiers_nemogym.nemo.head import fetch_merged_config
from verifiers_nemogym.net import is_loopback

_WILDCARD = ("0.0.0.0", "::")


@dataclass(frozen=True)
class AttachedTarget:
    """A running stack's head server, agents and `/run` targets."""

    head_url: str
    agents: dict[str, str]
    """Agent instance name -> the agent's base URL."""
    run_urls: dict[str, str]
    """Agent instance name -> base URL its rollouts' `POST /run` goes to (`run_targets`)."""
    policy_address: tuple[str, int]


def _port(value: object, what: str, head_url: str) -> int:
    """`value` as a TCP port, or a one-line ConfigError naming `what`."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ConfigError(
            f"the NeMo Gym stack at {head_url} names {what} port {str(value)[:40]!r}, "
            "which is no port (an integer in 1..65535)"
        )
    return value


def _reachable(url: str, what: str, head_host: str, head_url: str) -> str:
    """`url` (a server's base URL from the config) with its port checked and a wildcard host
    replaced by the head server's: a wildcard bind listens on every address of that machine."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    _port(port if port is not None else url.rsplit(":", 1)[-1], what, head_url)
    if (parts.hostname or "") not in _WILDCARD:
        return url
    host = f"[{head_host}]" if ":" in head_host else head_host
    return parts._replace(netloc=f"{host}:{port}").geturl()


async def describe_attached(url: str, proxy_host: str, proxy_port: int) -> AttachedTarget:
    """The running stack's agents and `/run` targets (`run_targets` of the merged config its head
    server serves). StackError if the head server cannot be reached or serves no usable config;
    ConfigError (one line) if `url` carries credentials, a port is not in 1..65535, the stack's
    `policy_model` is no address this process's proxy listens on, or a `/run` target is bound to
    loopback on another host. A wildcard-bound server is reached at the head server's host.
    `proxy_port` 0 means "the port the stack's policy_model names"."""
    head_url = url.rstrip("/")
    parts = urlsplit(head_url)
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            "--env.taskset.stack-url carries credentials (user:password@); NeMo Gym's head "
            "server takes none: remove them"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        shown = repr(url) if "@" not in url else "(not quoted: it may hold credentials)"
        raise ConfigError(f"--env.taskset.stack-url {shown} is not an http(s) URL of a head server")
    config = await fetch_merged_config(head_url)
    agents = {
        name: _reachable(target, f"agent {name!r}", parts.hostname, head_url)
        for name, target in server_urls(config, AGENTS).items()
    }
    if not agents:
        raise ConfigError(f"the NeMo Gym stack at {head_url} defines no agent server")
    run_urls = {
        name: _reachable(target, f"the /run target of agent {name!r}", parts.hostname, head_url)
        for name, target in run_targets(config).items()
    }
    for name, target in run_urls.items():
        # This process connects to the `/run` target only (an environment server reaches its
        # agent on the stack's own machine), so only the target's address must be routable.
        host = urlsplit(target).hostname or ""
        if is_loopback(host) and not is_loopback(parts.hostname):
            server = "agent" if target == agents[name] else "environment server fronting agent"
            raise ConfigError(
                f"the {server} {name!r} of the stack at {head_url} listens on {host} of that "
                "machine; start ng_run there with +default_host=<its routable address>"
            )
    policy = server_blocks(config, MODELS).get(POLICY_INSTANCE)
    if policy is None or not policy[1].get("host") or not policy[1].get("port"):
        raise ConfigError(
            f"the NeMo Gym stack at {head_url} has no `{POLICY_INSTANCE}` with a host and port; "
            "start it with this env's model proxy address as its policy_model"
        )
    policy_host = str(policy[1]["host"])
    policy_port = _port(policy[1]["port"], f"its {POLICY_INSTANCE}", head_url)
    matches_host = (
        policy_host == proxy_host
        or proxy_host in _WILDCARD
        or (is_loopback(policy_host) and is_loopback(proxy_host))
    )
    if not matches_host or (proxy_port and proxy_port != policy_port):
        raise ConfigError(
            f"the NeMo Gym stack at {head_url} calls its {POLICY_INSTANCE} at "
            f"{policy_host}:{policy_port}, but this env's model proxy would listen on "
            f"{proxy_host}:{proxy_port or policy_port}; set --env.taskset.proxy-host and "
            "--env.taskset.proxy-port to match"
        )
    return AttachedTarget(head_url, agents, run_urls, (policy_host, policy_port))
