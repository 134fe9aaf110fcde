"""A network namespace joined to the host by a veth pair: a test board at its own address, on a cable
that tests can pull.

`NetworkLink.create()` makes namespace `edgebench-PID-TOKEN` holding `eth0` at 10.231.x.2/30, joined to the
host's `ebTOKENh` at 10.231.x.1/30 (a free /30 picked at random). `exec_prefix()` runs a command inside it
(`ip netns exec`), `unplug()` / `replug()` take the board's end of the cable down and up: open TCP
connections go silent and new ones fail with "no route to host", as when a board's Ethernet is pulled.
`remove()` deletes both. Namespaces left by a dead test process are removed by the next `create()`.

Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2; `netns_supported()` says whether this host
has both.
"""

from __future__ import annotations

import ipaddress
import os
import random
import re
import secrets
import shutil
import subprocess
from dataclasses import dataclass

import psutil

PREFIX = "edgebench-"
POOL = ipaddress.ip_network("10.231.0.0/16")
_STALE = re.compile(rf"^{PREFIX}(\d+)-([0-9a-f]{{6}})\b")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {res.stderr.strip() or res.returncode}")
    return res


def netns_supported() -> bool:
    """True when iproute2 is installed and this process may create network namespaces."""
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "--net", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def remove_stale() -> None:
    """Delete the namespaces (and host ends) of test processes that died without cleaning up."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        match = _STALE.match(line)
        if match and not psutil.pid_exists(int(match[1])):
            _ip("link", "del", f"eb{match[2]}h", check=False)
            _ip("netns", "del", match[0], check=False)


def _free_subnet() -> ipaddress.IPv4Network:
    used = {
        ipaddress.ip_interface(cidr).network
        for cidr in re.findall(r"inet (\S+)", _ip("-o", "-4", "addr", "show").stdout)
    }
    subnets = list(POOL.subnets(new_prefix=30))
    for _ in range(100):
        net = random.choice(subnets)
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError(f"no free /30 left in {POOL}")


@dataclass(frozen=True)
class NetworkLink:
    namespace: str
    host_if: str
    board_if: str
    host_ip: str
    board_ip: str

    @classmethod
    def create(cls) -> NetworkLink:
        remove_stale()
        token = secrets.token_hex(3)
        net = _free_subnet()
        host_ip, board_ip = (str(a) for a in list(net.hosts())[:2])
        link = cls(f"{PREFIX}{os.getpid()}-{token}", f"eb{token}h", "eth0", host_ip, board_ip)
        try:
            link._build(f"eb{token}b", net.prefixlen)
        except BaseException:
            link.remove()
            raise
        return link

    def _build(self, peer: str, prefixlen: int) -> None:
        ns = self.namespace
        _ip("netns", "add", ns)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", ns)
        _ip("-n", ns, "link", "set", peer, "name", self.board_if)
        _ip("addr", "add", f"{self.host_ip}/{prefixlen}", "dev", self.host_if)
        _ip("-n", ns, "addr", "add", f"{self.board_ip}/{prefixlen}", "dev", self.board_if)
        _ip("link", "set", self.host_if, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "link", "set", self.board_if, "up")

    def exec_prefix(self) -> list[str]:
        """argv prefix that runs a command inside the namespace."""
        return ["ip", "netns", "exec", self.namespace]

    def unplug(self) -> None:
        """The board's end goes down: its connections fall silent, new ones find no route."""
        _ip("-n", self.namespace, "link", "set", self.board_if, "down")

    def replug(self) -> None:
        _ip("-n", self.namespace, "link", "set", self.board_if, "up")

    def remove(self) -> None:
        # The host end goes explicitly: a namespace still referenced by closing sockets outlives `netns del`.
        _ip("link", "del", self.host_if, check=False)
        _ip("netns", "del", self.namespace, check=False)
