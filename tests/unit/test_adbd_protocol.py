"""The emulated adbd's wire formats, path mapping and service parsing, and AdbTransport's server lookup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgebench.descriptors import DeviceSpec
from edgebench.errors import ConfigError, TransportError
from edgebench.testing import adbd_proto as P
from edgebench.testing.adbd import parse_args
from edgebench.testing.adbd_device import DeviceFs, DeviceLayout, default_props
from edgebench.testing.adbd_services import exit_status, parse_shell_service
from edgebench.transports.adb import server_address


def test_packet_header_has_checksum_and_magic() -> None:
    raw = P.encode(P.Packet(P.A_WRTE, 7, 9, b"\x01\x02\xff"))
    assert len(raw) == 24 + 3
    command, arg0, arg1, length, check = P.decode_header(raw[:24], P.MAX_PAYLOAD)
    assert (command, arg0, arg1, length, check) == (P.A_WRTE, 7, 9, 3, 0x102)
    assert raw[:4] == b"WRTE" and int.from_bytes(raw[20:24], "little") == P.A_WRTE ^ 0xFFFFFFFF


def test_bad_magic_unknown_command_and_oversize_payload_are_refused() -> None:
    good = bytearray(P.encode(P.Packet(P.A_OKAY, 1, 2)))
    bad_magic = good[:20] + b"\0\0\0\0"
    with pytest.raises(P.ProtocolError, match="magic"):
        P.decode_header(bytes(bad_magic), P.MAX_PAYLOAD)
    unknown = P.encode(P.Packet(0x11223344, 0, 0))
    with pytest.raises(P.ProtocolError, match="unknown command"):
        P.decode_header(unknown[:24], P.MAX_PAYLOAD)
    big = P.encode(P.Packet(P.A_WRTE, 1, 2, b"x" * 5000))
    with pytest.raises(P.ProtocolError, match="exceeds"):
        P.decode_header(big[:24], P.MAX_PAYLOAD_V1)


def test_banner_carries_product_fields_and_only_given_features() -> None:
    props = default_props("SER1") | {"ro.product.model": "Pixel 8;x=y"}
    banner = P.device_banner(props, ["shell_v2", "stat_v2"])
    assert banner.startswith(b"device::ro.product.name=edgebench_emu;ro.product.model=Pixel 8_x_y;")
    assert banner.endswith(b";features=shell_v2,stat_v2")
    assert P.parse_banner_features(b"host::features=shell_v2,cmd,sendrecv_v2\0") == {
        "shell_v2",
        "cmd",
        "sendrecv_v2",
    }


def test_sync_structures_have_the_wire_sizes() -> None:
    assert P.STAT_V1.size == 16  # STAT + mode, size, mtime
    assert P.DENT_V1.size == 20  # DENT/DONE + mode, size, mtime, namelen
    assert P.STAT_V2.size == 72  # STA2/LST2 + error, dev, ino, mode, nlink, uid, gid, size, a/m/ctime
    assert P.sync_fail("no") == b"FAIL\x02\0\0\0no"
    assert P.shell_packet(P.SHELL_EXIT, b"\x03") == b"\x03\x01\0\0\0\x03"


@pytest.mark.parametrize(
    ("service", "expected"),
    [
        (":echo hi", (False, "echo hi")),
        (",v2,raw:ls -l", (True, "ls -l")),
        (",v2,TERM=xterm,pty:", (True, "")),
        (",raw,future-arg:id", (False, "id")),
        (":a:b", (False, "a:b")),
    ],
)
def test_shell_service_arguments(service: str, expected: tuple[bool, str]) -> None:
    assert parse_shell_service(service) == expected


def test_exit_status_of_a_signalled_command() -> None:
    assert (exit_status(0), exit_status(3), exit_status(-9)) == (0, 3, 137)


def test_device_paths_map_under_root_and_follow_links_in_device_view(tmp_path: Path) -> None:
    fs = DeviceFs(tmp_path)
    (tmp_path / "data" / "local").mkdir(parents=True)
    (tmp_path / "sdcard").mkdir()
    assert fs.resolve("/data/local/tmp/x") == (str(tmp_path / "data/local/tmp/x"), True)
    assert fs.resolve("/data/../etc/hostname") == ("/etc/hostname", False)
    assert fs.resolve("/usr/bin/env")[1] is False
    # An absolute link inside the device points into the device, not the host.
    os.symlink("/data/local", tmp_path / "sdcard" / "link")
    assert fs.resolve("/sdcard/link/f") == (str(tmp_path / "data/local/f"), True)
    assert fs.resolve("/sdcard/link", follow_last=False) == (str(tmp_path / "sdcard/link"), True)
    os.symlink("/sdcard/loop", tmp_path / "sdcard" / "loop")
    with pytest.raises(OSError):
        fs.resolve("/sdcard/loop/x")


def test_layout_prepares_tools_getprop_and_build_prop(tmp_path: Path) -> None:
    layout = DeviceLayout(tmp_path, "S1", {"ro.product.model": "M", "ro.x": "a=b"}, "/system/bin")
    layout.prepare()
    assert (tmp_path / "system/bin/getprop").stat().st_mode & 0o111
    assert os.path.islink(tmp_path / "system/bin/sh")
    assert "ro.x=a=b" in (tmp_path / "system/build.prop").read_text()
    argv = layout.sandbox_argv("echo hi")
    assert argv[-4:] == ["--", "/system/bin/sh", "-c", "echo hi"]
    assert ["--bind", str(tmp_path / "data"), "/data"] == argv[argv.index(str(tmp_path / "data")) - 1 :][:3]
    assert "--die-with-parent" in argv
    assert layout.shell_env()["PATH"] == "/system/bin"


def test_a_userland_phone_sees_the_userland_its_shell_and_toybox_applets(tmp_path: Path) -> None:
    """With a userland, the sandbox binds its top level (not the host's), /system/bin holds its mksh as sh
    and toybox's applets as links, and paths outside the device folders map into it."""
    userland = tmp_path / "userland"
    (userland / "usr/lib").mkdir(parents=True)
    (userland / "lib").symlink_to("usr/lib")
    (userland / "system/bin").mkdir(parents=True)
    (userland / "system/bin/mksh").write_bytes(b"mksh")
    (userland / "system/bin/toybox").write_bytes(b"toybox")
    (userland / "system/toybox-applets").write_text("ls\ncat\nsh\nuname\n")
    root = tmp_path / "phone"
    layout = DeviceLayout(root, "S1", {}, "/system/bin", userland=userland, env={"QEMU_CPU": "cortex-a76"})
    layout.prepare()
    sysbin = root / "system/bin"
    assert (sysbin / "sh").read_bytes() == b"mksh" and not os.path.islink(sysbin / "sh")
    assert os.readlink(sysbin / "ls") == "toybox" and os.readlink(sysbin / "uname") == "toybox"
    assert (sysbin / "getprop").read_text().startswith("#!/system/bin/sh\n")
    argv = layout.sandbox_argv("uname -m")
    assert ["--ro-bind", str(userland / "usr"), "/usr"] == argv[argv.index(str(userland / "usr")) - 1 :][:3]
    assert ["--symlink", "usr/lib", "/lib"] == argv[argv.index("usr/lib") - 1 :][:3]
    assert "/etc" not in argv and "/bin" not in argv  # nothing of the host's userland
    assert ["--bind", str(root / "system"), "/system"] == argv[argv.index(str(root / "system")) - 1 :][:3]
    assert layout.shell_env()["QEMU_CPU"] == "cortex-a76"
    fs = DeviceFs(root, userland)
    assert fs.resolve("/usr/lib/x") == (str(userland / "usr/lib/x"), False)
    assert fs.resolve("/data/local/tmp/f") == (str(root / "data/local/tmp/f"), True)


def test_adbd_refuses_emulator_ports_and_unimplemented_features(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--root", str(tmp_path), "--port", "5555"])
    assert "5555-5585" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--root", str(tmp_path), "--features", "shell_v2,sendrecv_v2"])
    assert "sendrecv_v2" in capsys.readouterr().err


def _spec(**kw: object) -> DeviceSpec:
    return DeviceSpec(
        name="p",
        transport="adb",
        workdir="/data/local/tmp/e",
        python="python3",
        serial="S",
        source="devices/p.toml",
        **kw,
    )  # type: ignore[arg-type]


def test_server_address_from_descriptor_environment_or_default() -> None:
    assert server_address(_spec(adb_server="10.1.2.3:5038"), {}) == ("10.1.2.3", 5038)
    assert server_address(_spec(adb_server="5039"), {}) == ("127.0.0.1", 5039)
    assert server_address(_spec(), {"ANDROID_ADB_SERVER_PORT": "6001"}) == ("127.0.0.1", 6001)
    assert server_address(_spec(), {}) == ("127.0.0.1", 5037)
    with pytest.raises(ConfigError, match="devices/p.toml: adb_server"):
        server_address(_spec(adb_server="host:notaport"), {})
    with pytest.raises(TransportError, match="ANDROID_ADB_SERVER_PORT"):
        server_address(_spec(), {"ANDROID_ADB_SERVER_PORT": "x"})
