"""Device-side services of the emulated adbd: `shell:` (v1 and shell protocol v2), `exec:`, `sync:`.

Shell commands run as `/system/bin/sh -c COMMAND` inside the device sandbox (adbd_device), each a session
leader in the phone's one process namespace (adbd_processes). Without the shell protocol stdout and stderr
share one pipe and there is no exit status, as on a phone; with `shell,v2` stdout, stderr and the exit code
come back as separate packets (a shell killed by signal N reports 128 + N, as adbd's 0x80 | N).

When the host closes the stream, this device does what AOSP's adbd does (packages/modules/adb, daemon
shell_service.cpp), no more: with the shell protocol it sends SIGHUP to the shell's pid only and closes
the shell's pipes; without it (a real adbd runs those on a PTY, whose hangup signals the session) it sends
SIGHUP to the shell's process group. Nothing is SIGKILLed and nothing is waited for: a child that does not
die of that (forked by `sh -c`, ignoring SIGHUP, in a group of its own) keeps running, re-parented to the
phone's init, exactly the survivors a real phone leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import stat
import sys
import time
from datetime import datetime

from . import adbd_proto as P
from .adbd_device import DeviceFs, DeviceLayout
from .adbd_processes import DeviceProcesses, read_child_pid
from .adbd_stream import Stream, StreamClosed


def parse_shell_service(rest: str) -> tuple[bool, str]:
    """`shell[,arg...]:command` (the part after `shell`) -> (shell protocol?, command).

    Arguments: `v2` selects the shell protocol; `raw`/`pty`/`TERM=` are accepted (this device has no
    PTYs: every command runs raw); unknown ones are ignored, as adbd does for future expansion.
    """
    args, _, command = rest.partition(":")
    v2 = "v2" in [a for a in args.split(",") if a]
    return v2, command


class ShellService:
    """One command: spawn in the sandbox, pump stdin/stdout/stderr, report the exit code (v2)."""

    def __init__(self, layout: DeviceLayout, procs: DeviceProcesses, command: str, *, v2: bool) -> None:
        self.layout = layout
        self.procs = procs
        self.command = command
        self.v2 = v2
        self._shell_pid: int | None = None
        self._hung_up = False
        self._started = time.monotonic()

    async def __call__(self, stream: Stream) -> None:
        info_read, info_write = os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.layout.sandbox_argv(
                    self.command or None, pidns_fd=self.procs.ns_fd, info_fd=info_write
                ),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE if self.v2 else asyncio.subprocess.STDOUT,
                env=self.layout.shell_env(),
                start_new_session=True,
                pass_fds=(self.procs.ns_fd, info_write),
            )
        except OSError as exc:
            os.close(info_read)
            await self._report_spawn_error(stream, exc)
            return
        finally:
            os.close(info_write)
        try:
            self._shell_pid = await read_child_pid(info_read)
        finally:
            os.close(info_read)
        self.procs.started(self._shell_pid)
        self._log("started")
        feeder = asyncio.create_task(self._feed_stdin(stream, proc))
        try:
            chunk = max(1, stream.sink.max_payload - (P.SHELL_HEADER.size if self.v2 else 0))
            pumps = [self._pump(stream, proc.stdout, P.SHELL_STDOUT, chunk)]
            if self.v2:
                pumps.append(self._pump(stream, proc.stderr, P.SHELL_STDERR, chunk))
            await asyncio.gather(*pumps)
            if not self._hung_up:
                code = exit_status(await proc.wait())
                if code > 128:
                    self._log(f"killed by signal {code - 128}")
                if self.v2:
                    await stream.write(P.shell_packet(P.SHELL_EXIT, bytes([code & 0xFF])))
        except StreamClosed:
            pass
        finally:
            feeder.cancel()
            if proc.returncode is None:
                self._hang_up(proc)
            self.procs.watch(proc)  # it exits when its shell does: never killed here
            with contextlib.suppress(StreamClosed):
                await stream.close()

    def _hang_up(self, proc: asyncio.subprocess.Process) -> None:
        """What adbd does when the host side of a shell goes away: SIGHUP (to the shell's pid with the
        shell protocol, to its process group as a PTY hangup without), and the shell's pipes closed."""
        if self._hung_up:
            return
        self._hung_up = True
        self._log("hung up: the host closed the stream")
        if self._shell_pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if self.v2:
                    os.kill(self._shell_pid, signal.SIGHUP)
                else:
                    os.killpg(self._shell_pid, signal.SIGHUP)
        if proc.stdin is not None:
            proc.stdin.close()
        transport = getattr(proc, "_transport", None)  # asyncio keeps the pipe transports there
        for fd in (1, 2):
            pipe = transport.get_pipe_transport(fd) if transport is not None else None
            if pipe is not None:
                pipe.close()

    async def _pump(self, stream: Stream, pipe: asyncio.StreamReader | None, kind: int, chunk: int) -> None:
        assert pipe is not None
        while True:
            data = await pipe.read(chunk)
            if not data:
                return
            await stream.write(P.shell_packet(kind, data) if self.v2 else data)

    async def _feed_stdin(self, stream: Stream, proc: asyncio.subprocess.Process) -> None:
        """Host bytes to the command's stdin; the host closing the stream hangs the shell up."""
        assert proc.stdin is not None
        stdin_open = True
        try:
            while True:
                if self.v2:
                    header = await stream.read_exactly(P.SHELL_HEADER.size)
                    kind, length = P.SHELL_HEADER.unpack(header)
                    data = await stream.read_exactly(length) if length else b""
                else:
                    data = await stream.read()
                    if not data:
                        raise StreamClosed("host closed the stream")
                    kind = P.SHELL_STDIN
                if kind == P.SHELL_STDIN and stdin_open and data:
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                        proc.stdin.write(data)
                        await proc.stdin.drain()
                elif kind == P.SHELL_CLOSE_STDIN and stdin_open:
                    stdin_open = False
                    self._log("stdin closed by the host (CLOSE_STDIN)")
                    proc.stdin.close()
        except StreamClosed:
            if proc.returncode is None:
                self._hang_up(proc)

    def _log(self, event: str) -> None:
        """One line on adbd's log (stderr): a shell started, or ended by anything but its own exit, so an
        unexpected kill leaves a trail: when, which shell, what else ran then."""
        took = time.monotonic() - self._started
        print(
            f"adbd: {datetime.now().strftime('%H:%M:%S.%f')[:-3]} shell pid {self._shell_pid} "
            f"after {took:.2f} s: {event}: {self.command[-120:]!r}",
            file=sys.stderr,
            flush=True,
        )

    async def _report_spawn_error(self, stream: Stream, exc: OSError) -> None:
        message = f"error: cannot start the device shell: {exc}\n".encode()
        try:
            if self.v2:
                await stream.write(P.shell_packet(P.SHELL_STDERR, message))
                await stream.write(P.shell_packet(P.SHELL_EXIT, bytes([126])))
            else:
                await stream.write(message)
        except StreamClosed:
            pass
        await stream.close()


def exit_status(returncode: int) -> int:
    """A shell-style exit status: 128 + signal for a command killed by a signal."""
    return 128 - returncode if returncode < 0 else returncode


# ---- sync ---------------------------------------------------------------------------------------
class SyncService:
    """The file service behind `adb push/pull/ls` (STAT, LIST, SEND, RECV, DATA, DONE, QUIT)."""

    def __init__(self, fs: DeviceFs, *, stat_v2: bool) -> None:
        self.fs = fs
        self.stat_v2 = stat_v2

    async def __call__(self, stream: Stream) -> None:
        try:
            while await self._one_request(stream):
                pass
        except StreamClosed:
            pass
        finally:
            await stream.close()

    async def _one_request(self, stream: Stream) -> bool:
        ident, length = P.SYNC_REQUEST.unpack(await stream.read_exactly(P.SYNC_REQUEST.size))
        if length > P.SYNC_PATH_MAX:
            await stream.write(P.sync_fail("path too long"))
            return False
        path = (await stream.read_exactly(length)).decode("utf-8", errors="surrogateescape")
        if ident == b"STAT":
            await stream.write(self._stat_v1(path))
        elif ident in (b"STA2", b"LST2") and self.stat_v2:
            await stream.write(self._stat_v2(path, follow=ident == b"STA2", ident=ident))
        elif ident == b"LIST":
            await self._list(stream, path)
        elif ident == b"SEND":
            return await self._send(stream, path)
        elif ident == b"RECV":
            return await self._recv(stream, path)
        elif ident == b"QUIT":
            return False
        else:
            await stream.write(P.sync_fail(f"unknown command {int.from_bytes(ident, 'little'):08x}"))
            return False
        return True

    def _stat_v1(self, path: str) -> bytes:
        # v1 STAT is an lstat; a missing file is all zeros.
        try:
            host, _ = self.fs.resolve(path, follow_last=False)
            st = os.lstat(host)
        except OSError:
            return P.STAT_V1.pack(b"STAT", 0, 0, 0)
        return P.STAT_V1.pack(
            b"STAT", st.st_mode & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF, int(st.st_mtime) & 0xFFFFFFFF
        )

    def _stat_v2(self, path: str, *, follow: bool, ident: bytes) -> bytes:
        try:
            host, _ = self.fs.resolve(path, follow_last=follow)
            st = os.stat(host) if follow else os.lstat(host)
        except OSError as exc:
            return P.STAT_V2.pack(ident, exc.errno or errno.EIO, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        return P.STAT_V2.pack(
            ident,
            0,
            st.st_dev,
            st.st_ino,
            st.st_mode,
            st.st_nlink,
            st.st_uid,
            st.st_gid,
            st.st_size,
            int(st.st_atime),
            int(st.st_mtime),
            int(st.st_ctime),
        )

    async def _list(self, stream: Stream, path: str) -> None:
        try:
            host, _ = self.fs.resolve(path)
            names = [".", "..", *sorted(os.listdir(host))]
        except OSError:
            names, host = [], ""
        for name in names:
            try:
                st = os.lstat(os.path.join(host, name))
            except OSError:
                continue
            raw = name.encode("utf-8", errors="surrogateescape")
            await stream.write(
                P.DENT_V1.pack(
                    b"DENT",
                    st.st_mode & 0xFFFFFFFF,
                    st.st_size & 0xFFFFFFFF,
                    int(st.st_mtime) & 0xFFFFFFFF,
                    len(raw),
                )
                + raw
            )
        await stream.write(P.DENT_V1.pack(b"DONE", 0, 0, 0, 0))

    async def _send(self, stream: Stream, spec: str) -> bool:
        path, comma, mode_text = spec.rpartition(",")
        if not comma:
            await stream.write(P.sync_fail("missing , in ID_SEND_V1"))
            return False
        try:
            mode = int(mode_text, 0)
        except ValueError:
            await stream.write(P.sync_fail("bad mode"))
            return False
        if stat.S_ISLNK(mode):
            await stream.write(P.sync_fail("symlinks are not supported by this device"))
            await self._drain_send(stream)
            return False
        perms = mode & 0o777
        perms |= (perms >> 3) & 0o070 | (perms >> 3) & 0o007  # as adbd: user bits to group and other
        try:
            fd = self._open_for_send(path, perms)
        except OSError as exc:
            await stream.write(P.sync_fail(f"couldn't create file: {os.strerror(exc.errno or errno.EIO)}"))
            await self._drain_send(stream)
            return False
        mtime = None
        try:
            with os.fdopen(fd, "wb") as out:
                while True:
                    ident, size = P.SYNC_REQUEST.unpack(await stream.read_exactly(P.SYNC_REQUEST.size))
                    if ident == b"DONE":
                        mtime = size
                        break
                    if ident != b"DATA" or size > P.SYNC_DATA_MAX:
                        await stream.write(P.sync_fail("invalid data message"))
                        return False
                    out.write(await stream.read_exactly(size))
        except OSError as exc:
            await stream.write(P.sync_fail(f"write failed: {os.strerror(exc.errno or errno.EIO)}"))
            await self._drain_send(stream)
            return False
        host, _ = self.fs.resolve(path, follow_last=False)
        with contextlib.suppress(OSError):
            os.utime(host, (mtime, mtime))
        await stream.write(P.sync_status(b"OKAY", 0))
        return True

    def _open_for_send(self, path: str, perms: int) -> int:
        # As adbd: the last component is not followed; a regular file or a symlink there is replaced.
        host, writable = self.fs.resolve(path, follow_last=False)
        if not writable:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        with contextlib.suppress(FileNotFoundError):
            mode = os.lstat(host).st_mode
            if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
                os.unlink(host)
            elif stat.S_ISDIR(mode):
                raise OSError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        os.makedirs(os.path.dirname(host), mode=0o775, exist_ok=True)  # fixed_push_mkdir
        fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, perms)
        os.fchmod(fd, perms)
        return fd

    async def _drain_send(self, stream: Stream) -> None:
        # Like adbd: after a FAIL, swallow the DATA the host keeps sending until DONE.
        with contextlib.suppress(StreamClosed):
            while True:
                ident, size = P.SYNC_REQUEST.unpack(await stream.read_exactly(P.SYNC_REQUEST.size))
                if ident != b"DATA" or size > P.SYNC_DATA_MAX:
                    return
                await stream.read_exactly(size)

    async def _recv(self, stream: Stream, path: str) -> bool:
        try:
            host, _ = self.fs.resolve(path)
            handle = open(host, "rb")
        except OSError as exc:
            await stream.write(P.sync_fail(f"open failed: {os.strerror(exc.errno or errno.EIO)}"))
            return False
        # DATA blocks of at most 64 KiB, several per transport packet (as adbd's socket would carry).
        batch = bytearray()
        try:
            while True:
                try:
                    block = handle.read(P.SYNC_DATA_MAX)
                except OSError as exc:
                    reason = os.strerror(exc.errno or errno.EIO)
                    await stream.write(bytes(batch) + P.sync_fail(f"read failed: {reason}"))
                    return False
                if not block:
                    break
                batch += P.sync_status(b"DATA", len(block)) + block
                if len(batch) + P.SYNC_REQUEST.size + P.SYNC_DATA_MAX > stream.sink.max_payload:
                    await stream.write(bytes(batch))
                    batch.clear()
        finally:
            handle.close()
        await stream.write(bytes(batch) + P.sync_status(b"DONE", 0))
        return True
