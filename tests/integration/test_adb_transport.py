"""AdbTransport against the real adb server and the emulated phone: commands, transfers, and every way a
phone fails (frozen, killed mid-command or mid-transfer, dropped, gone) as a typed error in time."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from functools import partial as partial_call
from pathlib import Path

import pytest

from edgebench.descriptors import DeviceSpec
from edgebench.errors import CommandTimeout, ConnectionLost, TransferError, TransportError
from edgebench.testing.adblab import AdbServer, free_port, port_open
from edgebench.testing.pytest_adb import AdbPhoneLab
from edgebench.transports import open_transport
from edgebench.transports.adb import AdbTransport

pytestmark = pytest.mark.integration

NASTY = "we ird;$(touch /data/local/tmp/pwned) `id` 'q\" &|>x"


@pytest.fixture(scope="module")
def adb(adb_phone_module: AdbPhoneLab) -> AdbTransport:
    transport = open_transport(adb_phone_module.spec())
    assert isinstance(transport, AdbTransport)
    return transport


def after(seconds: float, action: Callable[[], object]) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


def test_exit_codes_streams_and_argv_survive_exactly(adb: AdbTransport) -> None:
    res = adb.run(["printf", "%s|", "two words", "it's", '"q"', "$HOME", "a\nb"], timeout=20)
    assert (res.returncode, res.stdout, res.stderr) == (0, 'two words|it\'s|"q"|$HOME|a\nb|', "")
    res = adb.run(["sh", "-c", "echo out; echo err >&2; exit 7"], timeout=20)
    assert (res.returncode, res.stdout, res.stderr) == (7, "out\n", "err\n")
    missing = adb.run(["no-such-command-edgebench"], timeout=20)
    assert missing.returncode == 127 and "not found" in missing.stderr
    res = adb.run(["sh", "-c", 'printf %s "$EB_X"'], timeout=20, env={"EB_X": "a b;$(id)`id`'\""})
    assert res.stdout == "a b;$(id)`id`'\""
    assert adb.run(["sh", "-c", "kill -9 $$"], timeout=20).returncode == 137


def test_push_pull_read_text_round_trip(
    adb: AdbTransport, adb_phone_module: AdbPhoneLab, tmp_path: Path
) -> None:
    data = os.urandom(2 * 1024 * 1024 + 7)
    src = tmp_path / "w.bin"
    src.write_bytes(data)
    src.chmod(0o755)
    adb.push(src, "/data/local/tmp/t/sub/w.bin", timeout=30)
    on_device = adb_phone_module.phone.host_path("/data/local/tmp/t/sub/w.bin")
    assert on_device.read_bytes() == data and on_device.stat().st_mode & 0o111  # mode kept: runnable
    dst = tmp_path / "back.bin"
    adb.pull("/data/local/tmp/t/sub/w.bin", dst, timeout=30)
    assert dst.read_bytes() == data and not (tmp_path / "back.bin.part").exists()
    assert adb.read_text("/system/build.prop", timeout=10).startswith("ro.product.name=")
    sysfs = adb_phone_module.phone.host_path("/sys/class/thermal/thermal_zone0")
    sysfs.mkdir(parents=True, exist_ok=True)
    (sysfs / "temp").write_text("41500\n")
    assert adb.read_text("/sys/class/thermal/thermal_zone0/temp", timeout=10) == "41500\n"
    with pytest.raises(TransferError, match="No such file"):
        adb.read_text("/data/local/tmp/none", timeout=10)
    with pytest.raises(TransferError, match="Read-only"):
        adb.push(src, "/etc/edgebench-should-not-exist", timeout=10)
    assert not Path("/etc/edgebench-should-not-exist").exists()


def test_shell_syntax_in_paths_runs_nothing_on_the_device(
    adb: AdbTransport, adb_phone_module: AdbPhoneLab, tmp_path: Path
) -> None:
    src = tmp_path / "m.onnx"
    src.write_bytes(b"model bytes")
    remote = f"/data/local/tmp/{NASTY}/{NASTY}.onnx"
    adb.push(src, remote, timeout=20)
    res = adb.run(["cat", remote], timeout=20)
    assert (res.returncode, res.stdout) == (0, "model bytes")
    assert adb.run(["sha256sum", "--", remote], timeout=20).stdout.endswith(f"  {remote}\n")
    assert not adb_phone_module.phone.host_path("/data/local/tmp/pwned").exists()
    assert not adb_phone_module.phone.host_path("/data/local/tmp/x").exists()  # no `>x` redirection either


def test_device_without_shell_v2_still_gives_real_exit_codes(
    adb_phone_factory: Callable[..., AdbPhoneLab],
) -> None:
    lab = adb_phone_factory("oldphone", features=["stat_v2", "fixed_push_mkdir"])
    old = AdbTransport(lab.spec())
    assert "shell_v2" not in old.features(timeout=10)
    res = old.run(["sh", "-c", "echo out; echo err >&2; exit 5"], timeout=20)
    assert res.returncode == 5 and sorted(res.stdout.split()) == ["err", "out"]  # one merged stream
    assert old.run(["printf", "no newline"], timeout=20).stdout == "no newline"
    # killed mid-command: the output ends without the exit marker, which is a lost device, not rc 0
    after(0.7, lab.phone.kill)
    start = time.monotonic()
    with pytest.raises(ConnectionLost) as info:
        old.run(["sh", "-c", "echo started; sleep 30"], timeout=20)
    assert time.monotonic() - start < 10
    assert info.value.stdout == "started\n" and info.value.device == "oldphone"


def test_killed_mid_command_is_connection_lost_with_partial_output(adb_phone: AdbPhoneLab) -> None:
    adb = AdbTransport(adb_phone.spec())
    after(0.7, adb_phone.phone.kill)
    start = time.monotonic()
    with pytest.raises(ConnectionLost) as info:
        adb.run(["sh", "-c", "echo started; sleep 30"], timeout=20)
    assert time.monotonic() - start < 10
    err = info.value
    assert err.argv == ["sh", "-c", "echo started; sleep 30"] and err.stdout == "started\n"
    assert err.device == "phone" and "phone:" in str(err)
    # plugged back in: the same serial works again
    adb_phone.phone.power_on()
    assert adb.run(["echo", "back"], timeout=20).stdout == "back\n"


@pytest.mark.parametrize("direction", ["push", "pull"])
def test_killed_mid_transfer_is_a_transfer_error_not_a_hang(
    adb_phone: AdbPhoneLab, tmp_path: Path, direction: str
) -> None:
    adb = AdbTransport(adb_phone.spec())
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(48 * 1024 * 1024))
    pushed = adb_phone.phone.host_path("/data/local/tmp/big2.bin")
    if direction == "push":
        call: Callable[[], None] = partial_call(adb.push, big, "/data/local/tmp/big2.bin", timeout=30)
        folder, prefix = pushed.parent, pushed.name  # the bytes go to a temporary name beside it
    else:
        adb.push(big, "/data/local/tmp/big.bin", timeout=30)
        call = partial_call(adb.pull, "/data/local/tmp/big.bin", tmp_path / "got.bin", timeout=30)
        folder, prefix = tmp_path, "got.bin.part"
    outcome: list[BaseException | None] = []
    start = time.monotonic()
    worker = threading.Thread(target=lambda: outcome.append(_raised(call)))
    worker.start()
    while not (partial := _growing(folder, prefix)) and time.monotonic() - start < 10:
        time.sleep(0.001)
    adb_phone.phone.freeze()  # hold the transfer half-way ...
    assert partial is not None
    moved = partial.stat().st_size
    adb_phone.phone.kill()  # ... and pull the cable
    worker.join(15)
    assert not worker.is_alive() and time.monotonic() - start < 10
    assert 0 < moved < big.stat().st_size
    assert isinstance(outcome[0], TransferError), outcome
    assert "connection to the device lost" in str(outcome[0]) and str(outcome[0]).startswith("phone: ")
    assert not (tmp_path / "got.bin").exists() and not (tmp_path / "got.bin.part").exists()
    assert not pushed.exists()  # a failed push never leaves a truncated file under the real name
    if direction == "push":
        # Plugged back in: the next call removes the half-written temporary file.
        adb_phone.phone.power_on()
        adb.run(["true"], timeout=20)
        assert [p.name for p in folder.iterdir() if p.name.startswith(prefix)] == []


def _growing(folder: Path, prefix: str) -> Path | None:
    """A non-empty file in `folder` whose name starts with `prefix`."""
    for path in folder.glob(prefix + "*"):
        try:
            if path.stat().st_size > 0:
                return path
        except FileNotFoundError:
            continue
    return None


def _raised(call: Callable[[], object]) -> BaseException | None:
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        return exc
    return None


def test_frozen_phone_times_out_every_call_within_its_timeout(adb_phone: AdbPhoneLab, tmp_path: Path) -> None:
    adb = AdbTransport(adb_phone.spec())
    adb.features(timeout=10)
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(4 * 1024 * 1024))
    adb_phone.phone.freeze()
    calls = {
        "run": lambda: adb.run(["echo", "hi"], timeout=1.0),
        "push": lambda: adb.push(src, "/data/local/tmp/f.bin", timeout=1.0),
        "pull": lambda: adb.pull("/system/build.prop", tmp_path / "p", timeout=1.0),
        "read": lambda: adb.read_text("/system/build.prop", timeout=1.0),
    }
    for name, call in calls.items():
        start = time.monotonic()
        with pytest.raises(CommandTimeout) as info:
            call()
        elapsed = time.monotonic() - start
        assert 0.9 < elapsed < 3.0, (name, elapsed)
        assert info.value.device == "phone" and info.value.timeout == 1.0
    adb_phone.phone.thaw()
    assert adb.run(["echo", "thawed"], timeout=20).stdout == "thawed\n"


def test_a_slow_command_times_out_and_is_killed_on_the_device(adb_phone: AdbPhoneLab) -> None:
    adb = AdbTransport(adb_phone.spec())
    start = time.monotonic()
    with pytest.raises(CommandTimeout) as info:
        adb.run(["sh", "-c", "echo begun; exec sleep 30"], timeout=1.5)
    assert time.monotonic() - start < 4
    assert info.value.output == "begun\n" and info.value.argv[0] == "sh"
    deadline = time.monotonic() + 10
    while adb_phone.phone.status()["processes"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert adb_phone.phone.status()["processes"] == 0  # the stream closed, so the command died


def test_dropped_connection_mid_command_then_recovery(adb_phone: AdbPhoneLab) -> None:
    adb = AdbTransport(adb_phone.spec())
    after(0.7, lambda: adb_phone.phone.drop(reconnect=False))
    with pytest.raises(ConnectionLost):
        adb.run(["sh", "-c", "sleep 30"], timeout=20)
    adb_phone.phone.wait_online(30)
    assert adb.run(["echo", "again"], timeout=20).stdout == "again\n"


def test_unreachable_server_or_unknown_serial_fail_fast_and_start_nothing(
    adb_server: AdbServer, adb_phone_module: AdbPhoneLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead_port = free_port()
    spec = DeviceSpec(
        name="ghost",
        transport="adb",
        workdir="/data/local/tmp",
        python="python3",
        serial="127.0.0.1:1",
        adb_server=f"127.0.0.1:{dead_port}",
    )
    start = time.monotonic()
    with pytest.raises(TransportError, match=f"ghost: adb server 127.0.0.1:{dead_port} is not reachable"):
        AdbTransport(spec).run(["true"], timeout=5)
    assert time.monotonic() - start < 3
    assert not port_open(dead_port)  # adbutils' habit of spawning a server was not followed
    unknown = DeviceSpec(
        name="ghost",
        transport="adb",
        workdir="/data/local/tmp",
        python="python3",
        serial="no-such-serial",
        adb_server=adb_server.address,
    )
    with pytest.raises(TransportError, match="no-such-serial"):
        AdbTransport(unknown).run(["true"], timeout=5)
    # Without adb_server in the descriptor, ANDROID_ADB_SERVER_PORT picks the server.
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(adb_server.port))
    by_env = DeviceSpec(
        name="envphone",
        transport="adb",
        workdir="/data/local/tmp",
        python="python3",
        serial=adb_phone_module.phone.serial,
    )
    assert AdbTransport(by_env).run(["echo", "env"], timeout=10).stdout == "env\n"


def test_a_phone_without_python_on_its_path(adb_phone_factory: Callable[..., AdbPhoneLab]) -> None:
    lab = adb_phone_factory("bare", path="/system/bin")
    bare = AdbTransport(lab.spec())
    assert bare.run(["python3", "-c", "pass"], timeout=20).returncode == 127
    res = bare.run(["sh", "-c", "echo $PATH; getprop ro.product.cpu.abi; printf x | sha256sum"], timeout=20)
    lines = res.stdout.splitlines()
    assert res.returncode == 0 and lines[0] == "/system/bin" and lines[1]
    assert lines[2].startswith("2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881")
