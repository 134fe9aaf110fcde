"""Units of the ssh transport and devices --check that need no sshd: wrappers, host-key helpers, key
errors, connect timeouts against a silent socket, and the health facts script on a fake sysfs."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import paramiko
import pytest

from edgebench.descriptors import DeviceSpec
from edgebench.errors import CommandTimeout, ConfigError, HostKeyError, TransportError
from edgebench.lab.health import FACTS_SCRIPT, DeviceCheck, check_rows, failed, parse_facts
from edgebench.testing.sshd import generate_key
from edgebench.transports.local import LocalTransport
from edgebench.transports.ssh import (
    PASSPHRASE_ENV,
    SshTransport,
    _TrustOnFirstUse,
    fingerprint,
    known_hosts_line,
)


def spec(tmp_path: Path, **kw) -> DeviceSpec:  # type: ignore[no-untyped-def]
    known = tmp_path / "known_hosts"
    if not known.exists():
        known.write_text("")
    base = {
        "name": "b1",
        "transport": "ssh",
        "workdir": "/tmp/x",
        "python": "python3",
        "host": "127.0.0.1",
        "port": 1,
        "user": "lab",
        "known_hosts": str(known),
        "connect_timeout_s": 1.0,
        "source": str(tmp_path / "b1.toml"),
    }
    base.update(kw)
    return DeviceSpec(**base)


def test_known_hosts_line_and_fingerprint_match_openssh(tmp_path: Path) -> None:
    generate_key(tmp_path / "k")
    key = paramiko.Ed25519Key.from_private_key_file(str(tmp_path / "k"))
    assert known_hosts_line("10.0.0.5", 22, key) == f"10.0.0.5 ssh-ed25519 {key.get_base64()}"
    assert known_hosts_line("10.0.0.5", 2222, key).startswith("[10.0.0.5]:2222 ssh-ed25519 ")
    out = subprocess.run(
        ["ssh-keygen", "-lf", str(tmp_path / "k.pub")], capture_output=True, text=True, timeout=30
    )
    if out.returncode == 0:
        assert fingerprint(key) == out.stdout.split()[1]
    assert fingerprint(key).startswith("SHA256:") and "=" not in fingerprint(key)


def test_trust_on_first_use_appends_once_with_private_permissions(tmp_path: Path) -> None:
    generate_key(tmp_path / "host")
    key = paramiko.Ed25519Key.from_private_key_file(str(tmp_path / "host"))
    known = tmp_path / "new" / "known_hosts"
    transport = SshTransport.__new__(SshTransport)  # the policy only needs spec and device
    transport.spec = spec(tmp_path, known_hosts=str(known), port=2200, trust_on_first_use=True)
    transport.device = "b1"
    transport._known = None
    client = paramiko.SSHClient()
    for _ in range(2):
        _TrustOnFirstUse(transport).missing_host_key(client, "[127.0.0.1]:2200", key)
    assert known.read_text() == known_hosts_line("127.0.0.1", 2200, key) + "\n"
    assert known.stat().st_mode & 0o777 == 0o600
    assert client.get_host_keys().lookup("[127.0.0.1]:2200")["ssh-ed25519"] == key


def test_missing_known_hosts_is_refused_before_connecting(tmp_path: Path) -> None:
    with pytest.raises(HostKeyError) as err:
        SshTransport(spec(tmp_path, known_hosts=str(tmp_path / "absent")))
    for needle in ("absent", "trust_on_first_use", "b1.toml"):
        assert needle in str(err.value)


def test_key_problems_are_config_errors_that_never_show_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)
    with pytest.raises(ConfigError, match="not found"):
        SshTransport(spec(tmp_path, key=str(tmp_path / "nokey")))
    garbage = tmp_path / "garbage"
    garbage.write_text(
        "-----BEGIN OPENSSH PRIVATE KEY-----\n"
        "c2VjcmV0LW1hdGVyaWFsLXRoYXQtbXVzdC1ub3QtbGVhaw==\n"
        "-----END OPENSSH PRIVATE KEY-----\n"
    )
    with pytest.raises(ConfigError) as err:
        SshTransport(spec(tmp_path, key=str(garbage)))
    assert "c2VjcmV0" not in str(err.value) and "not a private key" in str(err.value)
    generate_key(tmp_path / "locked", passphrase="hunter2 hunter2")
    secret_lines = [ln for ln in (tmp_path / "locked").read_text().splitlines() if not ln.startswith("-")]
    with pytest.raises(ConfigError, match="encrypted") as err:
        SshTransport(spec(tmp_path, key=str(tmp_path / "locked")))
    monkeypatch.setenv(PASSPHRASE_ENV, "wrong")
    with pytest.raises(ConfigError, match="passphrase is wrong") as err2:
        SshTransport(spec(tmp_path, key=str(tmp_path / "locked")))
    for message in (str(err.value), str(err2.value)):
        assert "\n" not in message and "hunter2" not in message and "wrong" not in message.split("(")[0]
        assert not any(line in message for line in secret_lines)


def test_refused_port_is_a_quick_transport_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    start = time.monotonic()
    with pytest.raises(TransportError, match="connection refused"):
        SshTransport(spec(tmp_path, port=port))
    assert time.monotonic() - start < 5


def test_a_silent_server_hits_the_banner_timeout(tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    held: list[socket.socket] = []
    acceptor = threading.Thread(target=lambda: held.append(server.accept()[0]), daemon=True)
    acceptor.start()
    start = time.monotonic()
    try:
        with pytest.raises(TransportError) as err:
            # What is left of a call's budget is rarely round; the message still names it as a person would.
            SshTransport(spec(tmp_path, port=server.getsockname()[1], connect_timeout_s=0.9999987))
        assert time.monotonic() - start < 6
        assert "cannot connect" in str(err.value) and "\n" not in str(err.value)
        assert "within 1 s" in str(err.value) or "after 1 s" in str(err.value)
    finally:
        for s in held:
            s.close()
        server.close()


def test_facts_script_on_a_fake_sysfs(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for zone in ("thermal_zone0", "thermal_zone1"):
        (root / "sys/class/thermal" / zone).mkdir(parents=True)
    (root / "sys/devices/system/cpu/cpu0/cpufreq").mkdir(parents=True)
    (root / "sys/class/power_supply/battery").mkdir(parents=True)
    (root / "sys/class/power_supply/battery/current_now").write_text("-1000\n")
    res = LocalTransport().run(
        [
            "sh",
            "-c",
            FACTS_SCRIPT,
            "sh",
            f"{root}/",
            "/sys/class/power_supply/battery/current_now",
            "/sys/absent",
        ],
        timeout=30,
    )
    facts = parse_facts(res.stdout)
    assert facts["sensors"] == {"thermal_zones": 2, "cpufreq": 1, "power_supply": 1, "hwmon": 0}
    assert facts["files"] == {"/sys/class/power_supply/battery/current_now": True, "/sys/absent": False}
    assert facts["cores"] == os.cpu_count() and facts["memory_mb"] > 0 and facts["kernel"].startswith("Linux")


def test_check_rows_and_failures() -> None:
    ok = DeviceCheck(
        "a",
        "ssh",
        reachable=True,
        usable=True,
        arch="aarch64",
        cores=8,
        memory_mb=7812.5,
        kernel="Linux 6.1",
        python="3.11.2",
        runtimes={"onnxruntime": "1.17.0"},
        sensors={"thermal_zones": 3},
    )
    down = DeviceCheck("b", "ssh", error="cannot connect to lab@10.0.0.9:22: connection refused")
    broken = DeviceCheck("c", "adb", reachable=True, error="interpreter 'python3' not found")
    rows = check_rows([ok, down, broken])
    assert rows[0] == [
        "a (ssh)",
        "ok",
        "aarch64, 8 cores, 7812 MB, Linux 6.1",
        "py 3.11.2, ort 1.17.0",
        "thermal 3",
    ]
    assert rows[1][1] == "unreachable: cannot connect to lab@10.0.0.9:22: connection refused"
    assert rows[2][1].startswith("not usable: interpreter")
    assert failed([ok, down, broken]) == [down, broken]
    assert ok.to_dict()["status"] == "ok"


def test_timeouts_in_messages_are_rounded() -> None:
    assert "timed out after 2 s" in str(CommandTimeout(["echo", "hi"], 1.9999931))
    assert "timed out after 0.25 s" in str(CommandTimeout(["echo"], 0.25))
    assert "timed out after 1800 s" in str(CommandTimeout(["echo"], 1800.0))


def test_a_bad_env_name_fails_only_its_device(tmp_path: Path) -> None:
    from edgebench.descriptors import load_lab
    from edgebench.lab.health import check_devices

    lab_dir = tmp_path / "lab"
    lab_dir.mkdir()
    (lab_dir / "bad.toml").write_text('transport = "local"\nenv = { "OMP-THREADS" = "2" }\n')
    bad, good = check_devices(load_lab(lab_dir), ["bad", "local"], timeout=60)
    assert bad.misconfigured and not bad.usable
    assert bad.status == (
        f"misconfigured: {lab_dir / 'bad.toml'}: env: invalid environment variable name 'OMP-THREADS' "
        "(letters, digits and _ only)"
    )
    assert good.status == "ok"  # the rest of the lab is still checked
    assert failed([bad, good]) == [bad]


def test_known_hosts_is_read_as_openssh_reads_it(tmp_path: Path) -> None:
    from edgebench.transports.hostkeys import read_known_hosts

    keys = {}
    for name in ("board", "old", "ca"):
        generate_key(tmp_path / name)
        keys[name] = paramiko.Ed25519Key.from_private_key_file(str(tmp_path / name))
    hashed = paramiko.HostKeys.hash_host("[10.0.0.7]:2222")
    known = tmp_path / "known_hosts"
    known.write_text(
        "# lab boards\n\n"
        f"@cert-authority *.lab {keys['ca'].get_name()} {keys['ca'].get_base64()}\n"
        f"@revoked * {keys['old'].get_name()} {keys['old'].get_base64()}\n"
        f"10.0.0.5 {keys['old'].get_name()} {keys['old'].get_base64()}\n"  # pins a revoked key: pins nothing
        f"{hashed} {keys['board'].get_name()} {keys['board'].get_base64()}\n"
        "10.0.0.6 ssh-ed25519 not-base64!\n"
        "@unknown-marker 10.0.0.8 ssh-ed25519 AAAA\n"
    )
    parsed = read_known_hosts(known)
    assert parsed.cert_authority_lines == [3] and parsed.skipped_lines == [7, 8]
    assert parsed.revocation(keys["old"]).line == 4 and parsed.revocation(keys["board"]) is None
    host_keys = paramiko.HostKeys()
    parsed.install(host_keys)
    assert host_keys.lookup("10.0.0.5") is None
    assert host_keys.lookup("[10.0.0.7]:2222")["ssh-ed25519"] == keys["board"]
    with pytest.raises(Exception):  # noqa: B017 - paramiko's own loader refuses this file outright
        paramiko.HostKeys(str(known))
