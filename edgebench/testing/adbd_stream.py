"""One ADB stream (OPEN ... CLSE) inside a transport connection, with ADB's flow control.

Outgoing: after each WRTE the sender waits for the peer's OKAY before the next (no delayed_ack).
Incoming: each WRTE is acknowledged with OKAY only when the service has consumed it, so a slow
consumer pushes back on the host exactly as adbd does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from .adbd_proto import A_CLSE, A_OKAY, A_WRTE, Packet


class StreamClosed(Exception):
    """The stream (or its whole connection) is gone."""


class PacketSink(Protocol):
    """What a stream needs from its connection."""

    max_payload: int

    async def send(self, packet: Packet) -> None: ...

    def forget(self, local_id: int) -> None: ...


class Stream:
    """A service's view of its stream: read host bytes, write device bytes, close."""

    def __init__(self, sink: PacketSink, local_id: int, remote_id: int) -> None:
        self.sink = sink
        self.local_id = local_id
        self.remote_id = remote_id
        self.closed = False
        self._inbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._pending = bytearray()
        self._may_send = asyncio.Event()
        self._may_send.set()
        self._write_lock = asyncio.Lock()

    # ---- from the connection -----------------------------------------------------------------
    def on_okay(self) -> None:
        self._may_send.set()

    def on_write(self, data: bytes) -> None:
        if not self.closed:
            self._inbox.put_nowait(data)

    def on_close(self) -> None:
        """The peer closed the stream, or the connection died."""
        self.closed = True
        self._inbox.put_nowait(None)
        self._may_send.set()

    # ---- for services --------------------------------------------------------------------------
    async def read(self) -> bytes:
        """The next chunk from the host; b'' once the stream is closed."""
        if self._pending:
            data = bytes(self._pending)
            self._pending.clear()
            return data
        item = await self._inbox.get()
        if item is None:
            self._inbox.put_nowait(None)
            return b""
        await self._ack()
        return item

    async def read_exactly(self, n: int) -> bytes:
        """Exactly n bytes, or StreamClosed."""
        while len(self._pending) < n:
            item = await self._inbox.get()
            if item is None:
                self._inbox.put_nowait(None)
                raise StreamClosed(f"stream closed with {len(self._pending)} of {n} bytes")
            self._pending += item
            await self._ack()
        data = bytes(self._pending[:n])
        del self._pending[:n]
        return data

    async def write(self, data: bytes) -> None:
        """Send data as WRTE packets of at most the negotiated payload, each acknowledged."""
        async with self._write_lock:
            view = memoryview(data)
            while view:
                await self._may_send.wait()
                if self.closed:
                    raise StreamClosed("stream closed by the host")
                chunk, view = bytes(view[: self.sink.max_payload]), view[self.sink.max_payload :]
                self._may_send.clear()
                await self.sink.send(Packet(A_WRTE, self.local_id, self.remote_id, chunk))

    async def close(self) -> None:
        """Close from the device side (CLSE), once."""
        if self.closed:
            self.sink.forget(self.local_id)
            return
        self.closed = True
        self._may_send.set()
        try:
            await self.sink.send(Packet(A_CLSE, self.local_id, self.remote_id))
        except StreamClosed:
            pass
        self.sink.forget(self.local_id)

    async def _ack(self) -> None:
        if not self.closed:
            await self.sink.send(Packet(A_OKAY, self.local_id, self.remote_id))


Service = Callable[[Stream], Awaitable[None]]
