"""known_hosts as OpenSSH reads it: plain pins, `@revoked` keys, `@cert-authority` lines, bad lines skipped.

paramiko's own loader refuses a whole file over one marker line (it reads `@revoked` as a host name and the
key type as base64), which would make every ssh device unreachable although OpenSSH accepts the file. Here:

- plain lines pin keys (hashed `|1|` host names included, as paramiko matches them);
- `@revoked` lines name keys that are never accepted, for any host (sshd(8): "must not ever be accepted");
  a pinned line carrying a revoked key pins nothing;
- `@cert-authority` lines are kept aside: edgebench pins host keys and does not verify host certificates;
- a line that cannot be parsed is skipped, as OpenSSH skips it (its host then reads as unknown: refused).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

REVOKED = "@revoked"
CERT_AUTHORITY = "@cert-authority"


@dataclass(frozen=True)
class Revoked:
    """A key marked @revoked, and where."""

    key: Any
    line: int


@dataclass
class KnownHosts:
    """What one known_hosts file says."""

    path: Path
    pins: list[tuple[list[str], Any]] = field(default_factory=list)  # (host names, key)
    revoked: list[Revoked] = field(default_factory=list)
    cert_authority_lines: list[int] = field(default_factory=list)
    skipped_lines: list[int] = field(default_factory=list)

    def revocation(self, key: Any) -> Revoked | None:
        """The @revoked entry for this key, if there is one."""
        for entry in self.revoked:
            if _same_key(entry.key, key):
                return entry
        return None

    def install(self, host_keys: paramiko.HostKeys) -> None:
        """Give paramiko the usable pins (revoked keys left out, so a revoked key can never match)."""
        for names, key in self.pins:
            if self.revocation(key) is None:
                for name in names:
                    host_keys.add(name, key.get_name(), key)


def read_known_hosts(path: Path) -> KnownHosts:
    """Parse the file; OSError / UnicodeDecodeError when it cannot be read."""
    result = KnownHosts(path)
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        marker = ""
        if line.startswith("@"):
            marker, _, line = line.partition(" ")
            line = line.strip()
        if marker == CERT_AUTHORITY:
            result.cert_authority_lines.append(number)
            continue
        entry = _entry(line, number)
        if entry is None or marker not in ("", REVOKED):
            result.skipped_lines.append(number)
        elif marker == REVOKED:
            result.revoked.append(Revoked(entry.key, number))
        else:
            result.pins.append((list(entry.hostnames), entry.key))
    return result


def _entry(line: str, number: int) -> HostKeyEntry | None:
    try:
        return HostKeyEntry.from_line(" ".join(line.split()), number)
    except (InvalidHostKey, binascii.Error, ValueError, paramiko.SSHException):
        return None


def _same_key(a: Any, b: Any) -> bool:
    return a.get_name() == b.get_name() and a.asbytes() == b.asbytes()


def host_entry(host: str | None, port: int) -> str:
    """How known_hosts names host:port (`[host]:port` when the port is not 22)."""
    return f"{host}" if port == 22 else f"[{host}]:{port}"


def known_hosts_line(host: str, port: int, key: Any) -> str:
    """The OpenSSH known_hosts line pinning `key` for host:port (`[host]:port` when port != 22)."""
    return f"{host_entry(host, port)} {key.get_name()} {key.get_base64()}"


def fingerprint(key: Any) -> str:
    """OpenSSH-style SHA256 fingerprint of a public key (what `ssh-keygen -lf` prints)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")
