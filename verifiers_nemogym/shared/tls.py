"""TLS and the access token of a shared stack used across hosts (`stack up --listen`).

The trust model is SSH's, not a CA's: the host makes a fresh self-signed certificate when it
starts listening and a client trusts exactly the one its pin (`sha256:<hex>` of the DER bytes)
names, checked before a byte of the request is sent; neither chain nor host name is checked. An
access token, a 0600 file, then proves the client; it is never on a command line, and callers
register it with `redact.protect`. docs/shared-stacks.md, "Across hosts".
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import re
import secrets
import socket
import ssl
import stat
from pathlib import Path
from typing import Any

import aiohttp

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.net import bind_error

CERT_FILE = "tls-cert.pem"
KEY_FILE = "tls-key.pem"
TOKEN_FILE = "access-token"
"""In the stack folder: the listener's certificate, its key (0600) and the access token (0600)."""
TOKEN_ENV_VAR = "VF_NEMOGYM_STACK_TOKEN"
"""Environment variable holding the access token, for clients not given a token file."""
LINK_TIMEOUT = 15.0
"""Seconds after which a connection whose peer stopped answering fails (see `keepalive_socket`)."""
_KEEPIDLE, _KEEPINTVL, _KEEPCNT = 5, 3, 3

_PIN = re.compile(r"^sha256:([0-9a-f]{64})$")


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` as (host, port); ConfigError (one line) unless HOST is an IP address and
    PORT in 1..65535 (a name would resolve differently for the host and its clients)."""
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if not sep or address is None or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(
            f"--listen {text[:100]!r} is not HOST:PORT with HOST an IP address of this machine "
            "and PORT in 1..65535 (e.g. 10.0.0.5:8443, [fd00::5]:8443)"
        )
    return str(address), int(port_text)


def check_bindable(host: str, port: int) -> None:
    """ConfigError (one line) if `host:port` cannot be bound now (not an address of this
    machine, or the port is taken); the socket is closed again at once."""
    if (error := bind_error(host, port)) is not None:
        raise ConfigError(f"--listen {host}:{port}: cannot listen ({error.strerror})")


def format_pin(cert_der: bytes) -> str:
    return "sha256:" + hashlib.sha256(cert_der).hexdigest()


def parse_pin(text: str) -> bytes:
    """The SHA-256 digest a pin names; ConfigError (one line) if it is not `sha256:<64 hex>`."""
    match = _PIN.match(text.strip().lower())
    if match is None:
        raise ConfigError(
            "--env.taskset.stack-pin must be sha256:<64 hex digits>, as `nemo-gym-env stack up "
            "--listen` prints it"
        )
    return bytes.fromhex(match.group(1))


def client_ssl(pin: str) -> aiohttp.Fingerprint:
    """What aiohttp's `ssl=` takes to trust exactly the certificate `pin` names."""
    return aiohttp.Fingerprint(parse_pin(pin))


def _write_private(path: Path, data: bytes, mode: int) -> None:
    """`data` as `path` with `mode`, atomically (a temporary file renamed over it), never
    through a symlink and never readable by anyone else while it is written."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def make_certificate(directory: Path, host: str) -> str:
    """A new P-256 key and a certificate for `host` (its SAN), written as `CERT_FILE` (0644) and
    `KEY_FILE` (0600) in `directory`, never through a symlink; returns the certificate's pin."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nemo-gym-env stack host")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write_private(directory / KEY_FILE, key_pem, 0o600)
    _write_private(directory / CERT_FILE, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return format_pin(cert.public_bytes(serialization.Encoding.DER))


def server_context(directory: Path) -> ssl.SSLContext:
    """A TLS >= 1.2 server context serving the certificate `make_certificate` wrote."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(directory / CERT_FILE, directory / KEY_FILE)
    return context


def write_token(path: Path) -> str:
    """A fresh random access token, written to `path` (0600, readable by its owner alone)."""
    token = secrets.token_urlsafe(32)
    _write_private(path, token.encode() + b"\n", 0o600)
    return token


def read_token(file: Path | None) -> str:
    """The access token from `file`, else from `$TOKEN_ENV_VAR`; ConfigError (one line, never
    quoting a token) if neither gives one."""
    if file is not None:
        try:
            mode = stat.S_IMODE(file.expanduser().stat().st_mode)
            if mode & 0o077:
                # As ssh refuses a private key others can read: the token is as good as theirs.
                raise ConfigError(
                    f"--env.taskset.stack-token-file {file} is readable or writable by other "
                    f"users (mode {mode:o}): `chmod 600` it"
                )
            token = file.expanduser().read_text().strip()
        except OSError as e:
            raise ConfigError(
                f"--env.taskset.stack-token-file {file}: cannot read it ({e.strerror})"
            ) from None
        if not token:
            raise ConfigError(f"--env.taskset.stack-token-file {file} is empty")
        return token
    token = os.environ.get(TOKEN_ENV_VAR, "").strip()
    if not token:
        raise ConfigError(
            "a stack host listening with TLS needs its access token: give "
            f"--env.taskset.stack-token-file FILE or set {TOKEN_ENV_VAR} (the file `stack up "
            "--listen` names)"
        )
    return token


def keepalive_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """A client socket that fails within about `LINK_TIMEOUT` s of its peer going silent."""
    family, kind, proto = addr_info[0], addr_info[1], addr_info[2]
    sock = socket.socket(family, kind, proto)
    set_keepalive(sock)
    return sock


def set_keepalive(sock: socket.socket) -> None:
    """TCP keepalive probes after `_KEEPIDLE` s of silence and `TCP_USER_TIMEOUT`: a link that
    stops acknowledging is an error within about `LINK_TIMEOUT` s, on an idle wait as on a send."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, _KEEPIDLE)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, _KEEPINTVL)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, _KEEPCNT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(LINK_TIMEOUT * 1000))
