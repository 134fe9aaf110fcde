"""Shared fixtures. The real test lab (sshd boards, adb phones, sandbox sysfs, Dask) lives in
edgebench.testing so labs can reuse it in their own CI; it is imported here as pytest fixtures."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgebench.testing.pytest_adb import *  # noqa: F403
from edgebench.testing.pytest_arm import (  # noqa: F401
    arm_board,
    arm_emulation_session,
    arm_lab_session,
    arm_phone_factory,
    arm_phone_userland,
)
from edgebench.testing.pytest_ssh import (  # noqa: F401
    fresh_ssh_board,
    net_ssh_board,
    slow_ssh_board,
    ssh_board,
)

DISK_NEEDED_GB = 8.0  # the suite at its fullest: 7.1 GB more in use, df sampled every 10 s beside a CI run


def pytest_report_header(config: pytest.Config) -> str:
    """The free disk where the suite writes, first: a full disk fails every test after it."""
    where = tempfile.gettempdir()
    free = shutil.disk_usage(where).free / 2**30
    short = f" (the suite needs about {DISK_NEEDED_GB:.0f} GB: expect 'No space left on device')"
    return f"disk: {free:.1f} GB free in {where}" + (short if free < DISK_NEEDED_GB else "")


@pytest.fixture(autouse=True, scope="session")
def _this_checkout_in_subprocesses() -> Iterator[None]:
    """Every `python -m edgebench` a test starts runs this checkout's code, whatever edgebench the
    interpreter has installed (an editable install of another clone would otherwise be what runs)."""
    root = str(Path(__file__).resolve().parents[1])
    rest = os.environ.get("PYTHONPATH")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", root if not rest else os.pathsep.join([root, rest]))
        yield


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Built-in models and the local device's workdir go to one session-wide temp cache."""
    cache = tmp_path_factory.getbasetemp() / "xdg-cache"
    cache.mkdir(exist_ok=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A clean working directory (store and reports land here)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@dataclass(frozen=True)
class SmokeRun:
    """The README's main job's `edgebench run suites/smoke.toml --json`, once per test session."""

    folder: Path
    store: Path
    suite: Path
    stdout: str
    env: dict[str, str]


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> SmokeRun:
    """The smoke suite run once on `local` into a store of its own (tests read it, never write it)."""
    from edgebench.testing.cli import edgebench

    folder = tmp_path_factory.mktemp("smoke")
    cache = tmp_path_factory.getbasetemp() / "xdg-cache"
    cache.mkdir(exist_ok=True)
    env = {"XDG_CACHE_HOME": str(cache)}
    suite = Path(__file__).parents[1] / "suites" / "smoke.toml"
    store = folder / "smoke.db"
    res = edgebench("run", suite, "--store", store, "--json", cwd=folder, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return SmokeRun(folder, store, suite, res.stdout, env)


def ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture
def tiny_onnx(tmp_path: Path) -> Path:
    """A one-node ONNX model (Relu over a [1, 4] float input) in the test's temp folder."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    return path


@pytest.fixture(params=["local", "ssh_board", "adb_phone_module"])
def lab_device(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    """(lab folder, device name) for each kind of device in the test lab: the host, a real sshd board and
    the emulated adb phone."""
    if request.param == "local":
        return tmp_path / "empty-lab", "local"
    if request.param == "ssh_board":
        board = request.getfixturevalue("ssh_board")
        return board.lab_dir, board.name
    phone = request.getfixturevalue(request.param)
    return phone.lab_dir, phone.device_name
