"""The real adb client and server (Debian adb) against the emulated device: shell, exit codes, push/pull,
ls/stat, getprop, reboot."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from edgebench.testing.adblab import AdbServer
from edgebench.testing.pytest_adb import AdbPhoneLab

pytestmark = pytest.mark.integration


def adb(server: AdbServer, lab: AdbPhoneLab, *args: str) -> tuple[int, str, str]:
    res = server.run_adb("-s", lab.phone.serial, *args)
    return res.returncode, res.stdout, res.stderr


def test_server_lists_the_phone_with_its_banner_properties(
    adb_server: AdbServer, adb_phone_module: AdbPhoneLab
) -> None:
    out = adb_server.run_adb("devices", "-l").stdout
    line = next(ln for ln in out.splitlines() if ln.startswith(adb_phone_module.phone.serial))
    assert "\tdevice" in line or " device " in line
    assert "model:edgebench_emulated_phone" in line and "device:emu" in line
    assert adb(adb_server, adb_phone_module, "get-state")[1].strip() == "device"
    features = adb_server.run_adb("-s", adb_phone_module.phone.serial, "features").stdout.split()
    assert sorted(features) == ["fixed_push_mkdir", "shell_v2", "stat_v2"]


def test_shell_output_streams_and_exit_codes(adb_server: AdbServer, adb_phone_module: AdbPhoneLab) -> None:
    assert adb(adb_server, adb_phone_module, "shell", "echo", "hello") == (0, "hello\n", "")
    rc, out, err = adb(adb_server, adb_phone_module, "shell", "echo out; echo err >&2; exit 3")
    assert (rc, out, err) == (3, "out\n", "err\n")
    rc, out, _ = adb(adb_server, adb_phone_module, "exec-out", "printf 'a\\0b'")
    assert (rc, out) == (0, "a\0b")
    rc, out, _ = adb(adb_server, adb_phone_module, "shell", "echo $TMPDIR; pwd")
    assert out.splitlines()[:2] == ["/data/local/tmp", "/"]


def test_push_pull_round_trip_is_exact_for_a_multi_megabyte_file(
    adb_server: AdbServer, adb_phone_module: AdbPhoneLab, tmp_path: Path
) -> None:
    data = os.urandom(3 * 1024 * 1024 + 12345)
    src = tmp_path / "blob.bin"
    src.write_bytes(data)
    rc, _, err = adb(adb_server, adb_phone_module, "push", str(src), "/data/local/tmp/new/dir/blob.bin")
    assert rc == 0, err
    assert adb_phone_module.phone.host_path("/data/local/tmp/new/dir/blob.bin").read_bytes() == data
    back = tmp_path / "back.bin"
    rc, _, err = adb(adb_server, adb_phone_module, "pull", "/data/local/tmp/new/dir/blob.bin", str(back))
    assert rc == 0, err
    assert back.read_bytes() == data
    # pushing into an existing directory keeps the file name (the client asks STAT/STA2 first)
    assert adb(adb_server, adb_phone_module, "push", str(src), "/data/local/tmp/new")[0] == 0
    assert adb_phone_module.phone.host_path("/data/local/tmp/new/blob.bin").stat().st_size == len(data)
    # the host's own folders are read-only for the device
    rc, out, err = adb(adb_server, adb_phone_module, "push", str(src), "/usr/blob.bin")
    assert rc != 0 and "Read-only file system" in out + err


def test_ls_and_stat_show_device_files(adb_server: AdbServer, adb_phone_module: AdbPhoneLab) -> None:
    folder = adb_phone_module.phone.host_path("/sdcard/listing")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "seven.txt").write_bytes(b"1234567")
    rc, out, _ = adb(adb_server, adb_phone_module, "ls", "/sdcard/listing")
    entries = {line.split()[-1]: line.split() for line in out.splitlines()}
    assert rc == 0 and {".", "..", "seven.txt"} <= set(entries)
    assert int(entries["seven.txt"][1], 16) == 7 and int(entries["seven.txt"][0], 16) & 0o170000 == 0o100000
    rc, out, _ = adb(adb_server, adb_phone_module, "shell", "stat", "-c", "%s", "/sdcard/listing/seven.txt")
    assert (rc, out) == (0, "7\n")
    assert adb(adb_server, adb_phone_module, "shell", "ls", "/system/bin/getprop")[0] == 0


def test_getprop_serves_configured_properties(
    adb_server: AdbServer, adb_phone_factory: Callable[..., AdbPhoneLab]
) -> None:
    lab = adb_phone_factory(
        "pixel",
        props={
            "ro.product.model": "Pixel 8",
            "ro.build.version.sdk": "34",
            "ro.product.cpu.abi": "arm64-v8a",
        },
        serial="37281FDJH",
    )
    assert adb(adb_server, lab, "shell", "getprop", "ro.product.model") == (0, "Pixel 8\n", "")
    assert adb(adb_server, lab, "shell", "getprop ro.build.version.sdk")[1] == "34\n"
    assert adb(adb_server, lab, "shell", "getprop ro.serialno")[1] == "37281FDJH\n"
    assert adb(adb_server, lab, "shell", "getprop no.such.prop fallback")[1] == "fallback\n"
    listing = adb(adb_server, lab, "shell", "getprop")[1]
    assert "[ro.product.cpu.abi]: [arm64-v8a]" in listing
    assert "model:Pixel_8" in adb_server.run_adb("devices", "-l").stdout


def test_reboot_keeps_data_and_the_device_comes_back(adb_server: AdbServer, adb_phone: AdbPhoneLab) -> None:
    phone = adb_phone.phone
    assert adb(adb_server, adb_phone, "shell", "echo kept > /data/local/tmp/k")[0] == 0
    phone.reboot(0.5)
    assert adb(adb_server, adb_phone, "shell", "cat /data/local/tmp/k") == (0, "kept\n", "")
    adb(adb_server, adb_phone, "reboot")  # the reboot: service, as `adb reboot` uses it
    phone.wait_ready(30)
    assert adb(adb_server, adb_phone, "shell", "echo up")[1] == "up\n"
