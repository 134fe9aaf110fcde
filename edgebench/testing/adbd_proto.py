"""Wire formats of the ADB transport, shell v2 and sync protocols (device side), as plain functions.

Transport packet: six little-endian uint32 (command, arg0, arg1, data length, data checksum,
magic = command ^ 0xffffffff) followed by the payload. The checksum is the byte sum of the payload;
peers at version 0x01000001 and later ignore it, older ones verify it, so it is always computed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass


def _cmd(name: bytes) -> int:
    return int.from_bytes(name, "little")


A_CNXN = _cmd(b"CNXN")
A_OPEN = _cmd(b"OPEN")
A_OKAY = _cmd(b"OKAY")
A_CLSE = _cmd(b"CLSE")
A_WRTE = _cmd(b"WRTE")
A_AUTH = _cmd(b"AUTH")
A_STLS = _cmd(b"STLS")

A_VERSION_MIN = 0x01000000  # checksummed, 4 KiB payloads
A_VERSION_SKIP_CHECKSUM = 0x01000001
MAX_PAYLOAD_V1 = 4 * 1024
MAX_PAYLOAD = 1024 * 1024

HEADER = struct.Struct("<6I")
COMMAND_NAMES = {
    A_CNXN: "CNXN",
    A_OPEN: "OPEN",
    A_OKAY: "OKAY",
    A_CLSE: "CLSE",
    A_WRTE: "WRTE",
    A_AUTH: "AUTH",
    A_STLS: "STLS",
}


class ProtocolError(Exception):
    """The peer sent something that is not an ADB packet; the connection is dropped."""


@dataclass(frozen=True)
class Packet:
    command: int
    arg0: int
    arg1: int
    data: bytes = b""

    @property
    def name(self) -> str:
        return COMMAND_NAMES.get(self.command, f"0x{self.command:08x}")


def checksum(data: bytes) -> int:
    return sum(data) & 0xFFFFFFFF


def encode(packet: Packet) -> bytes:
    """Header and payload of one packet, ready for the socket."""
    data = packet.data
    header = HEADER.pack(
        packet.command, packet.arg0, packet.arg1, len(data), checksum(data), packet.command ^ 0xFFFFFFFF
    )
    return header + data


def decode_header(raw: bytes, max_payload: int) -> tuple[int, int, int, int, int]:
    """(command, arg0, arg1, length, checksum) of a 24-byte header, or ProtocolError."""
    command, arg0, arg1, length, data_check, magic = HEADER.unpack(raw)
    if magic != command ^ 0xFFFFFFFF:
        raise ProtocolError(f"bad magic 0x{magic:08x} for command 0x{command:08x}")
    if command not in COMMAND_NAMES:
        raise ProtocolError(f"unknown command 0x{command:08x}")
    if length > max_payload:
        raise ProtocolError(f"payload of {length} bytes exceeds the maximum of {max_payload}")
    return command, arg0, arg1, length, data_check


def device_banner(props: dict[str, str], features: list[str]) -> bytes:
    """The CNXN payload: `device::name=value;...;features=a,b` (the server reads model etc. from it)."""
    keys = ("ro.product.name", "ro.product.model", "ro.product.device")
    parts = [f"{k}={_banner_safe(props.get(k, ''))}" for k in keys]
    parts.append("features=" + ",".join(features))
    return ("device::" + ";".join(parts)).encode()


def _banner_safe(value: str) -> str:
    # `;`, `=` and `,` delimit the banner; a property value may not contain them there.
    return "".join("_" if c in ";=," else c for c in value)


def parse_banner_features(banner: bytes) -> set[str]:
    """Features a peer announced in its CNXN banner (`host::features=shell_v2,cmd`)."""
    text = banner.split(b"\0", 1)[0].decode(errors="replace")
    _, _, props = text.partition("::")
    for item in props.split(";"):
        key, _, value = item.partition("=")
        if key == "features":
            return {f for f in value.split(",") if f}
    return set()


# ---- shell protocol v2: 1-byte id, uint32 length, payload ------------------------------------
SHELL_STDIN = 0
SHELL_STDOUT = 1
SHELL_STDERR = 2
SHELL_EXIT = 3
SHELL_CLOSE_STDIN = 4
SHELL_WINDOW_SIZE = 5
SHELL_HEADER = struct.Struct("<BI")


def shell_packet(kind: int, data: bytes) -> bytes:
    return SHELL_HEADER.pack(kind, len(data)) + data


# ---- sync protocol: 4-byte id, uint32 length/arg, payload ------------------------------------
SYNC_DATA_MAX = 64 * 1024
SYNC_PATH_MAX = 1024
SYNC_REQUEST = struct.Struct("<4sI")
STAT_V1 = struct.Struct("<4sIII")  # id, mode, size, mtime
DENT_V1 = struct.Struct("<4sIIII")  # id, mode, size, mtime, namelen
STAT_V2 = struct.Struct("<4sIQQIIIIQqqq")  # id, error, dev, ino, mode, nlink, uid, gid, size, a/m/ctime


def sync_status(ident: bytes, value: int = 0) -> bytes:
    return SYNC_REQUEST.pack(ident, value)


def sync_fail(message: str) -> bytes:
    data = message.encode()
    return SYNC_REQUEST.pack(b"FAIL", len(data)) + data
