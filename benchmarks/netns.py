"""Three hosts on one machine: network namespaces joined by a veth link, for the across-hosts
stack test (`tests/stack/test_across_hosts.py`) and the link benchmark (`benchmarks.link`).

Needs root (`ip netns`). Namespaces `<prefix>-a|b|c`: A and B each on a veth whose peer (`pa`,
`pb`) is a port of the bridge `br0` in C; C itself on the bridge by `vc`. A, B and C have the
addresses `A`, `B`, `C` (/24), each its own loopback. Every process started in them is the
caller's; `Hosts.destroy()` kills what is left and removes the namespaces.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass

A, B, C = "10.77.0.1", "10.77.0.2", "10.77.0.3"
DEVICES = {"a": "veth-a", "b": "veth-b", "c": "vc"}
"""Each host's device on the link."""


def ip(*args: str) -> str:
    """`ip ARGS...`'s output; CalledProcessError if it fails."""
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


@dataclass
class Hosts:
    """The namespaces `<prefix>-a|b|c` (see the module doc)."""

    prefix: str

    def name(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def run(self, host: str) -> list[str]:
        """The command prefix that runs a command in the namespace of `host`."""
        return ["ip", "netns", "exec", self.name(host)]

    def create(self) -> None:
        a, b, c = (self.name(h) for h in "abc")
        for ns in (a, b, c):
            ip("netns", "add", ns)
        ip("-n", c, "link", "add", "br0", "type", "bridge")
        ip("link", "add", "veth-a", "netns", a, "type", "veth", "peer", "name", "pa", "netns", c)
        ip("link", "add", "veth-b", "netns", b, "type", "veth", "peer", "name", "pb", "netns", c)
        ip("-n", c, "link", "add", "vc", "type", "veth", "peer", "name", "vcb")
        for port in ("pa", "pb", "vcb"):
            ip("-n", c, "link", "set", port, "master", "br0")
        for ns, host, address in ((a, "a", A), (b, "b", B), (c, "c", C)):
            ip("-n", ns, "addr", "add", f"{address}/24", "dev", DEVICES[host])
            ip("-n", ns, "link", "set", DEVICES[host], "up")
            ip("-n", ns, "link", "set", "lo", "up")
        for dev in ("br0", "pa", "pb", "vcb"):
            ip("-n", c, "link", "set", dev, "up")

    def link_of_b(self, up: bool) -> None:
        ip("-n", self.name("c"), "link", "set", "pb", "up" if up else "down")

    def pids(self) -> dict[str, list[int]]:
        found = {}
        for host in "abc":
            with contextlib.suppress(subprocess.CalledProcessError):
                found[host] = [int(p) for p in ip("netns", "pids", self.name(host)).split()]
        return found

    def listeners(self, host: str) -> list[tuple[str, int]]:
        """(address, port) of every listening TCP socket in the namespace of `host`."""
        out = subprocess.run(
            [*self.run(host), sys.executable, "-c", LISTENERS],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        return [(a, int(p)) for a, p in json.loads(out)]

    def destroy(self) -> None:
        """Last resort after a failure: what still runs in the namespaces (all started by
        the caller) is killed; then the namespaces go."""
        for pids in self.pids().values():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for host in "abc":
            with contextlib.suppress(subprocess.CalledProcessError):
                ip("netns", "del", self.name(host))


LISTENERS = r"""
import json, socket, struct
found = []
for path, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
    for line in open(path).read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state != "0A":
            continue
        raw, port = local.split(":")
        packed = bytes.fromhex(raw)
        words = [packed[i:i + 4][::-1] for i in range(0, len(packed), 4)]
        found.append((socket.inet_ntop(family, b"".join(words)), int(port, 16)))
print(json.dumps(found))
"""


@dataclass(frozen=True)
class Handover:
    """What `nemo-gym-env stack up --listen` prints for the env hosts."""

    url: str
    pin: str
    token_file: str


def handover(output: str) -> Handover | None:
    """The URL, pin and token file in the output of `stack up --listen`; None if any is
    missing."""
    url = re.search(r"--env\.taskset\.stack-url (https://\S+) ", output)
    pin = re.search(r"--env\.taskset\.stack-pin (sha256:[0-9a-f]{64})", output)
    token = re.search(r"access token: the file (\S+) \(mode 0600", output)
    if not (url and pin and token):
        return None
    return Handover(url.group(1), pin.group(1), token.group(1))
