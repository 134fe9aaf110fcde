"""Transports: local (subprocess), ssh (paramiko), adb (adbutils)."""

from __future__ import annotations

from ..descriptors import DeviceSpec
from .base import CommandResult, Transport, command_line
from .local import LocalTransport

__all__ = ["CommandResult", "Transport", "command_line", "LocalTransport", "open_transport"]


def open_transport(spec: DeviceSpec) -> Transport:
    """Connect to a device by its descriptor. Remote transports are imported only when used."""
    if spec.transport == "local":
        return LocalTransport(spec.name)
    if spec.transport == "ssh":
        from .ssh import SshTransport

        return SshTransport(spec)
    if spec.transport == "adb":
        from .adb import AdbTransport

        return AdbTransport(spec)
    raise ValueError(f"unknown transport {spec.transport!r}")
