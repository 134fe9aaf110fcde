"""The emulated adbd on the wire, driven by a hand-written host (an old, checksumming adb server):
handshake, payload limits, flow control, refused services, shell v2 packets and sync replies."""

from __future__ import annotations

import json
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgebench.testing import adbd_proto as P

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


@pytest.fixture(scope="module")
def adbd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("wire-phone")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edgebench.testing.adbd",
            "--root",
            str(root),
            "--port",
            "0",
            "--prop",
            "ro.product.model=Wire",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    ready = json.loads(proc.stdout.readline())
    yield {**ready, "root": root}
    proc.terminate()
    proc.wait(timeout=10)


class Host:
    """A minimal adb host side: packets over one TCP connection."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)

    def send(
        self, command: int, arg0: int, arg1: int, data: bytes = b"", *, checksum: int | None = None
    ) -> None:
        raw = bytearray(P.encode(P.Packet(command, arg0, arg1, data)))
        if checksum is not None:
            raw[16:20] = struct.pack("<I", checksum)
        self.sock.sendall(bytes(raw))

    def recv(self) -> P.Packet:
        header = self._exact(24)
        command, arg0, arg1, length, check = P.decode_header(header, P.MAX_PAYLOAD)
        data = self._exact(length)
        assert P.checksum(data) == check  # the device always computes checksums
        return P.Packet(command, arg0, arg1, data)

    def _exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    def handshake(self, version: int = P.A_VERSION_MIN, max_data: int = P.MAX_PAYLOAD_V1) -> P.Packet:
        self.send(P.A_CNXN, version, max_data, b"host::\0")
        return self.recv()

    def close(self) -> None:
        self.sock.close()


def test_old_host_gets_its_version_small_payloads_and_a_device_banner(adbd: dict) -> None:
    host = Host(adbd["port"])
    cnxn = host.handshake()
    assert cnxn.command == P.A_CNXN and cnxn.arg0 == P.A_VERSION_MIN and cnxn.arg1 == P.MAX_PAYLOAD_V1
    assert cnxn.data.startswith(b"device::") and b"ro.product.model=Wire" in cnxn.data
    assert b"features=shell_v2,stat_v2,fixed_push_mkdir" in cnxn.data
    assert b"sendrecv_v2" not in cnxn.data and b"delayed_ack" not in cnxn.data

    # 10000 bytes of output arrive in WRTEs of at most 4096 bytes, each only after our OKAY.
    host.send(P.A_OPEN, 5, 0, b"shell:head -c 10000 /dev/zero\0")
    okay = host.recv()
    assert okay.command == P.A_OKAY and okay.arg1 == 5 and okay.arg0 != 0
    local = okay.arg0
    received = b""
    while True:
        packet = host.recv()
        if packet.command == P.A_CLSE:
            assert (packet.arg0, packet.arg1) == (local, 5)
            break
        assert packet.command == P.A_WRTE and (packet.arg0, packet.arg1) == (local, 5)
        assert len(packet.data) <= P.MAX_PAYLOAD_V1
        received += packet.data
        if len(received) < 10000:
            host.sock.settimeout(0.3)
            with pytest.raises(TimeoutError):  # no more data until we acknowledge
                host.recv()
            host.sock.settimeout(10)
        host.send(P.A_OKAY, 5, local)
    assert received == b"\0" * 10000
    host.close()


def test_unknown_service_is_refused_with_close(adbd: dict) -> None:
    host = Host(adbd["port"])
    host.handshake(P.A_VERSION_SKIP_CHECKSUM, P.MAX_PAYLOAD)
    host.send(P.A_OPEN, 9, 0, b"jdwp:1234\0")
    refused = host.recv()
    assert (refused.command, refused.arg0, refused.arg1) == (P.A_CLSE, 0, 9)
    host.close()


def test_bad_checksum_from_an_old_host_drops_the_connection(adbd: dict) -> None:
    host = Host(adbd["port"])
    host.handshake()
    host.send(P.A_OPEN, 3, 0, b"shell:echo x\0", checksum=12345)
    with pytest.raises((EOFError, ConnectionResetError)):
        host.recv()
    host.close()


def test_shell_v2_packets_split_streams_and_carry_the_exit_code(adbd: dict) -> None:
    host = Host(adbd["port"])
    host.handshake(P.A_VERSION_SKIP_CHECKSUM, P.MAX_PAYLOAD)
    host.send(P.A_OPEN, 4, 0, b"shell,v2,raw:cat; echo err >&2; exit 42\0")
    local = host.recv().arg0
    stdin = P.shell_packet(P.SHELL_STDIN, b"from host\n") + P.shell_packet(P.SHELL_CLOSE_STDIN, b"")
    host.send(P.A_WRTE, 4, local, stdin)
    stream = b""
    while True:
        packet = host.recv()
        if packet.command == P.A_OKAY:
            continue  # the device acknowledged our stdin
        if packet.command == P.A_CLSE:
            break
        stream += packet.data
        host.send(P.A_OKAY, 4, local)
    parts = {}
    while stream:
        kind, length = P.SHELL_HEADER.unpack(stream[:5])
        parts[kind] = parts.get(kind, b"") + stream[5 : 5 + length]
        stream = stream[5 + length :]
    assert parts == {P.SHELL_STDOUT: b"from host\n", P.SHELL_STDERR: b"err\n", P.SHELL_EXIT: bytes([42])}
    host.close()


def _sync_roundtrip(host: Host, local: int, remote_id: int, request: bytes, expect: int) -> bytes:
    host.send(P.A_WRTE, remote_id, local, request)
    data = b""
    while len(data) < expect:
        packet = host.recv()
        if packet.command == P.A_WRTE:
            data += packet.data
            host.send(P.A_OKAY, remote_id, local)
    return data


def test_sync_stat_replies_have_exact_lengths(adbd: dict) -> None:
    root: Path = adbd["root"]
    (root / "data" / "f.bin").write_bytes(b"12345")
    host = Host(adbd["port"])
    host.handshake(P.A_VERSION_SKIP_CHECKSUM, P.MAX_PAYLOAD)
    host.send(P.A_OPEN, 6, 0, b"sync:\0")
    local = host.recv().arg0
    path = b"/data/f.bin"
    reply = _sync_roundtrip(host, local, 6, struct.pack("<4sI", b"STAT", len(path)) + path, 16)
    ident, mode, size, _mtime = P.STAT_V1.unpack(reply)
    assert (ident, size, mode & 0o170000) == (b"STAT", 5, 0o100000)
    reply = _sync_roundtrip(host, local, 6, struct.pack("<4sI", b"STA2", len(path)) + path, 72)
    fields = P.STAT_V2.unpack(reply)
    assert (fields[0], fields[1], fields[8]) == (b"STA2", 0, 5)
    missing = b"/data/none"
    reply = _sync_roundtrip(host, local, 6, struct.pack("<4sI", b"LST2", len(missing)) + missing, 72)
    assert P.STAT_V2.unpack(reply)[:2] == (b"LST2", 2)  # ENOENT
    reply = _sync_roundtrip(host, local, 6, struct.pack("<4sI", b"STAT", len(missing)) + missing, 16)
    assert reply == b"STAT" + b"\0" * 12
    host.close()
