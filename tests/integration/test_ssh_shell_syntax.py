"""Shell syntax in model paths, workdirs, arguments and env values runs nothing on a real ssh board.

Every payload tries to create a canary file (in the session's home, via `cd`, and in the current
directory; the board's sessions have their own HOME); the tests look for the canaries afterwards, in
every place a stray shell could have put them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from edgebench.models.builtin import builtin_model
from edgebench.testing.sshd import SshBoard
from edgebench.transports.ssh import SshTransport

pytestmark = pytest.mark.integration


def payloads(canary: str) -> list[str]:
    """Hostile fragments. File names cannot hold '/', so each one reaches home with `cd` instead."""
    return [
        f"; cd; touch {canary}",
        f"$(cd; touch {canary})",
        f"`cd; touch {canary}`",
        f"' ; cd; touch {canary}; '",
        f'" ; cd; touch {canary}; "',
        f"\n cd; touch {canary}\n",
        f"&& cd && touch {canary} &",
        f"| cd | touch {canary}",
    ]


def canary_places(*extra: Path) -> list[Path]:
    return [Path.home(), Path.cwd(), Path("/"), Path("/tmp"), *extra]


def assert_no_canary(canary: str, *places: Path) -> None:
    for place in canary_places(*places):
        assert not (place / canary).exists(), f"a shell ran a payload: {place / canary} exists"


@pytest.fixture
def canary() -> str:
    name = f"eb-canary-{uuid.uuid4().hex[:10]}"
    yield name
    for place in canary_places():
        (place / name).unlink(missing_ok=True)


def test_transport_passes_hostile_strings_as_data(ssh_board: SshBoard, tmp_path: Path, canary: str) -> None:
    evil = "".join(payloads(canary))
    transport = SshTransport(ssh_board.spec())
    try:
        res = transport.run(["printf", "%s", evil], timeout=20, env={"EB_EVIL": evil})
        assert res.returncode == 0 and res.stdout == evil
        res = transport.run(["sh", "-c", 'printf %s "$EB_EVIL"'], timeout=20, env={"EB_EVIL": evil})
        assert res.stdout == evil
        folder = tmp_path / "dir $(cd; touch x) `y` 'z'"
        local = tmp_path / "payload.bin"
        local.write_bytes(b"data")
        for i, fragment in enumerate(payloads(canary)):
            remote = folder / f"{i}{fragment.replace('/', '_')}.bin"
            transport.push(local, str(remote), timeout=20)
            assert remote.read_bytes() == b"data"
            assert transport.run(["cat", "--", str(remote)], timeout=20).stdout == "data"
            assert transport.read_text(str(remote), timeout=20) == "data"
    finally:
        transport.close()
    assert_no_canary(canary, tmp_path, ssh_board.workdir, ssh_board.home)


def test_bench_with_a_hostile_model_path_and_workdir(
    ssh_board: SshBoard, tmp_path: Path, canary: str
) -> None:
    hostile = payloads(canary)
    model_dir = tmp_path / f"models {hostile[1]} {hostile[2]}"
    model_dir.mkdir()
    model = model_dir / f"net {hostile[0]} {hostile[3]} {hostile[4]} {hostile[5]}.onnx"
    model.write_bytes(builtin_model("mlp").read_bytes())
    workdir = tmp_path / f"wd {hostile[1]} {hostile[6]} {hostile[7]}"
    lab = tmp_path / "lab"
    ssh_board.write_descriptor(lab, workdir=str(workdir), env={"EB_NOTE": hostile[1] + hostile[2]})
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgebench",
            "bench",
            str(model),
            "--device",
            "board",
            "--lab",
            str(lab),
            "--runs",
            "5",
            "--min-seconds",
            "0",
            "--warmup",
            "0",
            "--timeout",
            "120",
            "--json",
            "--store",
            str(tmp_path / "s.db"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ},
    )
    assert res.returncode == 0, res.stderr
    records = json.loads(res.stdout)["records"]
    assert records and {r["model"] for r in records} == {model.stem}  # the name is data, kept verbatim
    assert (workdir / "cache").is_dir()  # the hostile workdir was used literally
    assert_no_canary(canary, tmp_path, workdir, workdir.parent, ssh_board.workdir, ssh_board.home)
