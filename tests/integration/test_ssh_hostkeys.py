"""Host keys on a real sshd: unknown and changed keys are refused in one line; TOFU only by opt-in."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from edgebench.errors import HostKeyError
from edgebench.testing.cli import edgebench
from edgebench.testing.sshd import SshBoard
from edgebench.transports.ssh import SshTransport

pytestmark = pytest.mark.integration


def assert_one_line_lab_error(res: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert res.returncode == 3, (res.stdout, res.stderr)
    assert res.stdout == ""
    assert "Traceback" not in res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("edgebench: error:")]
    assert len(errors) == 1, res.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def test_unpinned_host_key_is_refused_by_the_cli(ssh_board: SshBoard, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("# nothing pinned yet\n")
    lab = tmp_path / "lab"
    ssh_board.write_descriptor(lab, known_hosts=str(empty))
    res = edgebench(
        "bench",
        "builtin:mlp",
        "--device",
        "board",
        "--lab",
        str(lab),
        "--store",
        str(tmp_path / "s.db"),
        cwd=tmp_path,
    )
    line = assert_one_line_lab_error(
        res, "board:", f"[127.0.0.1]:{ssh_board.port}", "not in", str(empty), "SHA256:", "trust_on_first_use"
    )
    assert "ssh-ed25519" in line
    assert empty.read_text() == "# nothing pinned yet\n"  # nothing was recorded behind the user's back


def test_missing_known_hosts_file_is_refused(ssh_board: SshBoard, tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    ssh_board.write_descriptor(lab, known_hosts=str(tmp_path / "nope" / "known_hosts"))
    res = edgebench("devices", "--check", "--device", "board", "--lab", str(lab), cwd=tmp_path)
    assert res.returncode == 3 and "Traceback" not in res.stderr
    assert "does not exist" in res.stderr and "unreachable" in res.stderr
    assert not (tmp_path / "nope").exists()


def test_changed_host_key_is_refused_even_with_trust_on_first_use(
    fresh_ssh_board: SshBoard, tmp_path: Path
) -> None:
    lab = tmp_path / "lab"
    fresh_ssh_board.write_descriptor(lab)
    pinned = fresh_ssh_board.known_hosts.read_text()
    fresh_ssh_board.rotate_host_key()  # a reinstalled board, or someone in the middle
    res = edgebench(
        "bench",
        "builtin:mlp",
        "--device",
        fresh_ssh_board.name,
        "--lab",
        str(lab),
        "--store",
        str(tmp_path / "s.db"),
        cwd=tmp_path,
    )
    assert_one_line_lab_error(res, "CHANGED", "refusing", str(fresh_ssh_board.known_hosts))
    with pytest.raises(HostKeyError, match="CHANGED"):
        SshTransport(fresh_ssh_board.spec(trust_on_first_use=True))
    assert fresh_ssh_board.known_hosts.read_text() == pinned  # the old pin is kept, never replaced


def test_trust_on_first_use_records_the_key_then_pins_it(ssh_board: SshBoard, tmp_path: Path) -> None:
    known = tmp_path / "fresh-ssh-dir" / "known_hosts"
    transport = SshTransport(ssh_board.spec(known_hosts=str(known), trust_on_first_use=True))
    try:
        assert transport.run(["echo", "ok"], timeout=20).stdout == "ok\n"
    finally:
        transport.close()
    assert known.read_text() == ssh_board.host_key_line() + "\n"
    assert oct(known.stat().st_mode & 0o777) == "0o600"
    # Pinned now: a descriptor without the opt-in connects, and a second TOFU adds no duplicate line.
    SshTransport(ssh_board.spec(known_hosts=str(known))).close()
    SshTransport(ssh_board.spec(known_hosts=str(known), trust_on_first_use=True)).close()
    assert known.read_text().count(str(ssh_board.port)) == 1
    # The file is one OpenSSH itself accepts.
    check = subprocess.run(
        ["ssh-keygen", "-F", f"[127.0.0.1]:{ssh_board.port}", "-f", str(known)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert check.returncode == 0 and "ssh-ed25519" in check.stdout


def test_tilde_in_known_hosts_is_expanded(
    ssh_board: SshBoard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text(ssh_board.host_key_line() + "\n")
    monkeypatch.setenv("HOME", str(home))
    transport = SshTransport(ssh_board.spec(known_hosts="~/.ssh/known_hosts"))
    transport.close()
    (home / ".ssh" / "known_hosts").write_text("")
    with pytest.raises(HostKeyError, match=str(home)):
        SshTransport(ssh_board.spec(known_hosts="~/.ssh/known_hosts"))


def test_hashed_known_hosts_entries_are_understood(ssh_board: SshBoard, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(ssh_board.host_key_line() + "\n")
    hashed = subprocess.run(
        ["ssh-keygen", "-H", "-f", str(known)], capture_output=True, text=True, timeout=30
    )
    if hashed.returncode != 0:
        pytest.skip("ssh-keygen cannot hash known_hosts here")
    assert known.read_text().startswith("|1|")
    SshTransport(ssh_board.spec(known_hosts=str(known))).close()
