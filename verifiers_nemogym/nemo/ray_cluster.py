"""Joining a Ray cluster the user runs (`ray_address`) instead of a stack's private Ray.

With `ray_address` the stack passes the user's address in NeMo Gym's `ray_head_node_address` key
and NeMo Gym's processes join that cluster as drivers (this machine must be a node of it: Ray
drivers talk to a raylet on their own machine); NeMo Gym only shuts down a Ray it started, so
stopping the stack never stops the cluster. The token is read as Ray reads it and reaches no
environment, command line, log or NeMo Gym config: docs/runtime.md, "Using your Ray cluster".
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.net import is_loopback

TOKEN_VAR = "RAY_AUTH_TOKEN"
TOKEN_PATH_VAR = "RAY_AUTH_TOKEN_PATH"
AUTH_MODE_VAR = "RAY_AUTH_MODE"
LOOPBACK_ONLY_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch whose "0" makes every Ray process use 127.0.0.1 as its node address."""
TOKEN_FILE = "cluster_auth_token"
CONNECT_TIMEOUT = 10.0
"""Seconds the address may take to accept a TCP connection."""
CHECK_TIMEOUT = 60.0
"""Seconds the whole check may take (Ray's own client gives up on a silent GCS after 40 s)."""
_PROBE = Path(__file__).with_name("ray_probe.py")
_SCHEMES = ("ray://", "http://", "https://", "grpc://")


def parse_ray_address(text: str) -> str:
    """`host:port` of a Ray cluster's head (its GCS port, `ray start --head --port`), or a
    one-line ConfigError saying what is wrong."""
    value = text.strip()
    hint = "give host:port of the cluster head's GCS (`ray start --head --port`): 10.0.0.5:6379"
    if value.lower().startswith(_SCHEMES):
        raise ConfigError(
            f"ray_address {text!r}: a URL is not a Ray cluster address (Ray Client `ray://` and "
            f"the dashboard's http:// are not supported); {hint}"
        )
    host, sep, port = value.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"ray_address {text!r} is not host:port; {hint}")
    if ":" in host and not bracketed:
        raise ConfigError(f"ray_address {text!r}: write an IPv6 address as [host]:port")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(f"ray_address {text!r} is not host:port; {hint}") from None
        return f"[{host}]:{int(port)}"
    if any(c.isspace() or c in "/@?#'\"\\" for c in host):
        raise ConfigError(f"ray_address {text!r} is not host:port; {hint}")
    return f"{host}:{int(port)}"


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class RayCluster:
    """A running Ray cluster a stack joins, and how its processes authenticate to it."""

    address: str
    """`host:port` of its GCS (`parse_ray_address`)."""
    token_path: str | None = None
    """The token file Ray reads (`RAY_AUTH_TOKEN_PATH`, or `~/.ray/auth_token`)."""
    auth_mode: str | None = None
    """`RAY_AUTH_MODE` as the user set it (None: token mode when there is a token)."""
    token: str | None = field(default=None, repr=False, compare=False)
    """The token, when the user gave its value (`RAY_AUTH_TOKEN`): a secret."""

    @property
    def host(self) -> str:
        return _split(self.address)[0]

    @property
    def port(self) -> int:
        return _split(self.address)[1]

    @classmethod
    def from_environ(cls, address: str, environ: dict[str, str] | None = None) -> RayCluster:
        """The cluster at `address` with the credentials Ray would use here: `RAY_AUTH_TOKEN` (a
        value), else `RAY_AUTH_TOKEN_PATH` (a file; ConfigError if it cannot be read), else
        `~/.ray/auth_token` if it exists; `RAY_AUTH_MODE` as the user set it."""
        environ = dict(os.environ if environ is None else environ)
        mode = environ.get(AUTH_MODE_VAR) or None
        token = environ.get(TOKEN_VAR) or None
        path: str | None = None
        if token is None and (named := environ.get(TOKEN_PATH_VAR)):
            path = str(Path(named).expanduser().absolute())
            if not os.access(path, os.R_OK) or not Path(path).is_file():
                raise ConfigError(f"{TOKEN_PATH_VAR}={named}: no readable token file there")
        elif token is None and (mode or "").lower() != "disabled":
            default = Path.home() / ".ray" / "auth_token"
            path = str(default) if default.is_file() else None
        return cls(parse_ray_address(address), path, mode, token)

    def to_dict(self) -> dict[str, Any]:
        """Everything but the token (for a stack host's `--spec`)."""
        return {"address": self.address, "token_path": self.token_path, "auth_mode": self.auth_mode}

    def secrets(self) -> str | None:
        return self.token

    @classmethod
    def from_dict(cls, data: dict[str, Any], token: str | None) -> RayCluster:
        return cls(
            str(data["address"]),
            data.get("token_path"),
            data.get("auth_mode"),
            token,
        )

    def env(self, base: dict[str, str], folder: Path) -> dict[str, str]:
        """`base` (`NeMoGymVenv.env`: private-Ray settings and no Ray credentials) made into
        the environment of processes joining this cluster: a token given as a value is written to
        `folder/auth_token` (0600; `folder` is the stack's private 0700 folder) and handed over
        as `RAY_AUTH_TOKEN_PATH`. `to_dict()` never holds the token (`secrets()` does)."""
        env = dict(base)
        if not is_loopback(self.host):
            # Ray then finds this node's address as the cluster sees it; "0" would make our
            # drivers look for a raylet on 127.0.0.1. A loopback address names a cluster
            # started in that loopback-only mode (Ray rewrites 127.0.0.1 to the machine's
            # address otherwise), so the setting stays.
            env.pop(LOOPBACK_ONLY_VAR, None)
        for key in (TOKEN_VAR, TOKEN_PATH_VAR, AUTH_MODE_VAR):
            env.pop(key, None)
        path = self.token_path
        if self.token is not None:
            path = str(self._write_token(folder))
        if path is not None:
            env[TOKEN_PATH_VAR] = path
        mode = self.auth_mode or ("token" if path is not None else None)
        if mode is not None:
            env[AUTH_MODE_VAR] = mode
        return env

    def _write_token(self, folder: Path) -> Path:
        path = folder / TOKEN_FILE
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(self.token or "")
        return path


async def check_cluster(
    python: Path, cluster: RayCluster, base_env: dict[str, str], folder: Path
) -> None:
    """Within `CHECK_TIMEOUT` s: None, or a one-line StackError when nothing answers at the
    address, the cluster refuses our token, or this machine is no live node of it; it starts no
    driver and no job. `python` runs Ray (the NeMo Gym runtime venv's `bin/python`);
    `base_env` and `folder` are as for `RayCluster.env`, so the check authenticates exactly as
    NeMo Gym's processes will."""
    where = f"the Ray cluster at {cluster.address}"
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT):
            _, writer = await asyncio.open_connection(cluster.host, cluster.port)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    except TimeoutError:
        raise StackError(
            f"{where} does not answer (no TCP connection in {CONNECT_TIMEOUT:g} s)"
        ) from None
    except ConnectionRefusedError:
        raise StackError(f"{where} does not answer (connection refused)") from None
    except OSError as e:
        raise StackError(f"{where} does not answer ({e.strerror or e})") from None
    env = cluster.env(base_env, folder)
    proc = await asyncio.create_subprocess_exec(
        str(python), "-I", str(_PROBE), cluster.address,
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        async with asyncio.timeout(CHECK_TIMEOUT - CONNECT_TIMEOUT):
            out, err = await proc.communicate()
    except TimeoutError:
        raise StackError(f"{where} accepts connections but is no Ray cluster head") from None
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    try:
        answer = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1][:200]
        raise StackError(f"{where} could not be checked (Ray's client failed: {last})") from None
    if answer.get("ok"):
        return
    kind, detail = answer.get("kind"), str(answer.get("detail") or "")
    if kind == "auth":
        raise StackError(
            f"{where} refused our Ray token: give the cluster's token with {TOKEN_PATH_VAR} "
            f"(a file) or {TOKEN_VAR}"
        )
    if kind == "no_node":
        raise StackError(
            f"{where} has no live node at this machine's address {answer.get('node_ip')} (its "
            f"nodes: {', '.join(answer.get('nodes') or []) or 'none'}); join it first "
            f"(`ray start --address={cluster.address}`)"
        )
    raise StackError(f"{where} is not a reachable Ray cluster head ({detail})")


RAY_TOKEN_FILE = "auth_token"


def private_ray_auth(ray_tmpdir: Path) -> dict[str, str]:
    """Environment entries that make a stack's Ray require a token of its own, written to
    `ray_tmpdir/auth_token` (mode 0600; `ray_tmpdir` must be the stack's private 0700 folder),
    never the world-readable `~/.ray/auth_token` (docs/reliability.md): every process of the
    stack reads `RAY_AUTH_TOKEN_PATH`. Raises OSError if the file cannot be created (or exists)."""
    path = ray_tmpdir / RAY_TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32))  # Ray's own token format: 256 bits, hex
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}
