"""Time limits are positive and finite everywhere: `--timeout` flags, a suite's `timeout`, a [[probe]]
table's `timeout`, a descriptor's `timeout` / `connect_timeout` refuse nan, inf, zero and negatives with one
line naming the flag or the file and key (exit 2); the transports themselves refuse a non-finite limit
before they touch the device (a nan deadline compares false with every clock reading: it never expires)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from edgebench.cli import main
from edgebench.descriptors import load_lab
from edgebench.errors import ConfigError, UserError
from edgebench.execution.suite import load_suite
from edgebench.testing.cli import edgebench
from edgebench.transports.adb import AdbTransport
from edgebench.transports.base import check_timeout
from edgebench.transports.local import LocalTransport
from edgebench.transports.ssh import SshTransport

BAD = ["nan", "inf", "-inf", "0", "-5"]
# Every verb that drives a device, with the arguments it needs to reach option parsing.
VERBS = [
    ["bench", "builtin:mlp"],
    ["probe", "matmul"],
    ["probe", "bandwidth"],
    ["probe", "threads", "--model", "builtin:mlp"],
    ["probe", "thermal", "--model", "builtin:mlp"],
    ["probe", "power", "--model", "builtin:mlp"],
    ["roofline", "builtin:mlp", "--device", "local"],
    ["profile", "builtin:mlp"],
    ["accuracy", "builtin:mlp", "--reference", "builtin:mlp"],
    ["sensitivity", "builtin:mlp"],
    ["run", "suite.toml"],
]


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as done:
        main(argv)
    return int(done.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: " ".join(v[:2]))
@pytest.mark.parametrize("value", BAD)
def test_timeout_flags_refuse_non_finite_and_non_positive_values(
    verb: list[str], value: str, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = cli([*verb, f"--timeout={value}"], capsys)
    assert code == 2, err
    [line] = err.strip().splitlines()
    assert "--timeout" in line and "positive number of seconds" in line
    assert not (workdir / "edgebench.db").exists()  # refused before anything ran


def test_lease_timeout_flag_refuses_nan(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = cli(["bench", "builtin:mlp", "--lease-timeout", "nan"], capsys)
    assert code == 2 and "--lease-timeout" in err


def test_the_real_command_line_refuses_nan_in_one_line(workdir: Path) -> None:
    res = edgebench("bench", "builtin:mlp", "--timeout", "nan", cwd=workdir, timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "edgebench: error: Invalid value for '--timeout': must be a positive number of seconds, got nan"
    ]


SUITE = """
name = "t"
devices = ["local"]
models = ["builtin:mlp"]
{top}
[[probe]]
kind = "bench"
{probe}
[policy]
{policy}
"""


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-5.0"])
@pytest.mark.parametrize(
    "where, key",
    [("top", "timeout"), ("probe", "probe[0].timeout"), ("policy", "policy.lease_timeout")],
)
def test_suite_timeouts_refuse_bad_values(tmp_path: Path, where: str, key: str, value: str) -> None:
    parts = {"top": "", "probe": "", "policy": ""}
    parts[where] = f"{key.rpartition('.')[2]} = {value}"
    path = tmp_path / "suite.toml"
    path.write_text(SUITE.format(**parts))
    with pytest.raises(ConfigError) as refused:
        load_suite(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: {key}: must be a positive number of seconds"), message


@pytest.mark.parametrize("key", ["cooldown_timeout", "backoff", "max_backoff", "worker_grace"])
def test_suite_durations_refuse_nan_and_inf(tmp_path: Path, key: str) -> None:
    for value in ("nan", "inf"):
        path = tmp_path / "suite.toml"
        path.write_text(SUITE.format(top="", probe="", policy=f"{key} = {value}"))
        with pytest.raises(ConfigError, match=rf"policy\.{key}: must be a finite number"):
            load_suite(path)


def test_run_refuses_a_suite_with_a_nan_timeout_exit_2(workdir: Path) -> None:
    (workdir / "suite.toml").write_text(SUITE.format(top="timeout = nan", probe="", policy=""))
    res = edgebench("run", "suite.toml", cwd=workdir, timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "edgebench: error: suite.toml: timeout: must be a positive number of seconds, got nan"
    ]


@pytest.mark.parametrize("key", ["timeout", "connect_timeout"])
@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_descriptor_timeouts_refuse_bad_values(tmp_path: Path, key: str, value: str) -> None:
    (tmp_path / "b.toml").write_text(f'name = "b"\ntransport = "local"\n{key} = {value}\n')
    with pytest.raises(ConfigError, match=rf"b\.toml: {key}: must be a positive number of seconds"):
        load_lab(tmp_path)


def test_descriptor_timeout_through_the_cli_exit_2(workdir: Path) -> None:
    (workdir / "devices").mkdir()
    (workdir / "devices" / "b.toml").write_text('name = "b"\ntransport = "local"\ntimeout = inf\n')
    res = edgebench("devices", cwd=workdir, timeout=60)
    assert (
        res.returncode == 2 and "b.toml: timeout: must be a positive number of seconds, got inf" in res.stderr
    )


def _ssh_without_connection() -> SshTransport:
    transport = object.__new__(SshTransport)  # the refusal must come before any connection is made
    transport.device = "board"
    return transport


@pytest.mark.parametrize("limit", [math.nan, math.inf, -1.0])
def test_transports_refuse_a_non_finite_or_negative_timeout(tmp_path: Path, limit: float) -> None:
    from edgebench.descriptors import DeviceSpec

    adb = AdbTransport(
        DeviceSpec(name="phone", transport="adb", workdir="/w", python="python3", serial="X", adb_server="127.0.0.1:9")
    )  # fmt: skip
    local = LocalTransport("local")
    src = tmp_path / "f"
    src.write_text("x")
    calls = [
        lambda: local.run(["sleep", "30"], timeout=limit),
        lambda: local.push(src, str(tmp_path / "g"), timeout=limit),
        lambda: local.pull(str(src), tmp_path / "h", timeout=limit),
        lambda: local.read_text(str(src), timeout=limit),
        lambda: adb.run(["true"], timeout=limit),
        lambda: adb.push(src, "/data/x", timeout=limit),
        lambda: adb.pull("/data/x", tmp_path / "i", timeout=limit),
        lambda: adb.read_text("/data/x", timeout=limit),
        lambda: _ssh_without_connection().run(["true"], timeout=limit),
        lambda: _ssh_without_connection().read_text("/etc/hostname", timeout=limit),
    ]
    for call in calls:
        with pytest.raises(UserError, match="timeout must"):
            call()
    assert not (tmp_path / "g").exists() and not (tmp_path / "h").exists()


def test_check_timeout_accepts_plain_limits() -> None:
    assert check_timeout(5, "d") == 5 and check_timeout(0.25, "d") == 0.25 and check_timeout(0.0, "d") == 0.0
    with pytest.raises(UserError):
        check_timeout(True, "d")  # type: ignore[arg-type]
