"""pytest fixtures for the adb part of the test lab: a real adb server and emulated phones.

Use them from a conftest.py with one line:

    from edgebench.testing.pytest_adb import *  # noqa: F401,F403

Fixtures
--------
``adb_server`` (session)
    An ``AdbServer``: the real Debian ``adb`` running ``nodaemon server`` on a free port (never
    5037, so a developer's own server is left alone), with its own HOME. Stopped at the end.
``adb_phone`` (function) / ``adb_phone_module`` (module)
    An ``AdbPhoneLab`` for one freshly started emulated phone, connected to ``adb_server``:

    - ``lab_dir``: a folder holding ``<device_name>.toml`` (transport = "adb", its serial and
      adb_server, workdir /data/local/tmp/edgebench, python = this interpreter), so a test can run
      ``edgebench bench builtin:mlp --device <device_name> --lab <lab_dir> --json``;
    - ``device_name``: "phone";
    - ``phone``: the ``EmulatedPhone`` control handle (``freeze()``, ``thaw()``, ``drop()``,
      ``reboot(s)``, ``kill()``, ``power_on()``, ``status()``, ``processes()`` (the phone's own
      process list), ``host_path("/data/...")``);
    - ``root``: the device root DIR (its /data, /sdcard, /system and /sys are folders there; write
      DIR/sys/class/thermal/... to drive sensors);
    - ``spec()``: the loaded ``DeviceSpec``.
``adb_phone_factory`` (function)
    ``make(name="phone", lab_dir=None, **PhoneOptions fields)`` -> ``AdbPhoneLab`` for phones with
    other properties, PATH (``path="/system/bin"``: no Python on the PATH) or features
    (``features=["stat_v2"]``: no shell v2). Phones share one lab_dir unless given their own.
    All are stopped after the test.

Without ``adb`` or ``bwrap`` the fixtures skip, except under CI (CI=true), where they fail.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest

from ..descriptors import DeviceSpec, load_lab
from .adblab import AdbServer, EmulatedPhone, PhoneOptions, write_descriptor

__all__ = [
    "AdbPhoneLab",
    "adb_server",
    "adb_phone",
    "adb_phone_module",
    "adb_phone_factory",
    "pytest_runtest_makereport",
]


@dataclass(frozen=True)
class AdbPhoneLab:
    """One emulated phone as a lab sees it: where its descriptor is, its name, handle and root."""

    lab_dir: Path
    device_name: str
    phone: EmulatedPhone
    root: Path

    def spec(self) -> DeviceSpec:
        return load_lab(self.lab_dir).get(self.device_name)


def _require_tools() -> None:
    missing = [tool for tool in ("adb", "bwrap") if shutil.which(tool) is None]
    problem = f"missing {', '.join(missing)} (Debian packages adb, bubblewrap)" if missing else ""
    if not problem:
        probe = subprocess.run(
            ["bwrap", "--ro-bind", "/", "/", "--", "true"], capture_output=True, text=True, timeout=30
        )
        if probe.returncode != 0:
            problem = f"bubblewrap cannot create a sandbox here: {probe.stderr.strip()}"
    if problem:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"adb test lab: {problem}")
        pytest.skip(f"adb test lab: {problem}")


@pytest.fixture(scope="session")
def adb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AdbServer]:
    """The session's own adb server (real adb, free port, own HOME)."""
    _require_tools()
    server = AdbServer.start(tmp_path_factory.mktemp("adb-server"))
    try:
        yield server
    finally:
        server.stop()


def start_phone(
    server: AdbServer, base: Path, name: str, lab_dir: Path | None, **options: Any
) -> AdbPhoneLab:
    """One emulated phone started under `base` with `options` (PhoneOptions fields, and the descriptor's
    python, timeout_s, extra), connected to `server`, its descriptor written to `lab_dir` (else base/lab)."""
    known = {f.name for f in fields(PhoneOptions)}
    unknown = set(options) - known - {"python", "timeout_s", "extra"}
    if unknown:
        raise TypeError(f"unknown phone options: {', '.join(sorted(unknown))}")
    descriptor_args = {k: options.pop(k) for k in ("python", "timeout_s", "extra") if k in options}
    root = base / f"{name}-root"
    phone = EmulatedPhone.start(root, server, PhoneOptions(**options))
    lab = lab_dir or base / "lab"
    write_descriptor(lab, name, phone, **descriptor_args)
    return AdbPhoneLab(lab, name, phone, root)


@contextlib.contextmanager
def phone_maker(
    server: AdbServer, base: Path, default_name: str, defaults: Callable[[dict[str, Any]], None] | None = None
) -> Iterator[Callable[..., AdbPhoneLab]]:
    """make(name=default_name, lab_dir=None, **options) -> AdbPhoneLab, `defaults` filling in the options
    first; every phone made is stopped on leaving (`make.started` lists them, for a failure's adbd log)."""
    started: list[AdbPhoneLab] = []

    def make(name: str = default_name, lab_dir: Path | None = None, **options: Any) -> AdbPhoneLab:
        if defaults is not None:
            defaults(options)
        lab = start_phone(server, base, name, lab_dir, **options)
        started.append(lab)
        return lab

    make.started = started  # type: ignore[attr-defined]
    try:
        yield make
    finally:
        for lab in reversed(started):
            lab.phone.stop()


@pytest.fixture
def adb_phone_factory(
    adb_server: AdbServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., AdbPhoneLab]]:
    """make(name="phone", lab_dir=None, **options) -> AdbPhoneLab; every phone stops after the test."""
    with phone_maker(adb_server, tmp_path_factory.mktemp("adb-phones"), "phone") as make:
        yield make


@pytest.fixture
def adb_phone(adb_phone_factory: Callable[..., AdbPhoneLab]) -> AdbPhoneLab:
    """One fresh emulated phone named "phone" with its lab folder."""
    return adb_phone_factory()


@pytest.fixture(scope="module")
def adb_phone_module(
    adb_server: AdbServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AdbPhoneLab]:
    """One emulated phone shared by the tests of a module (faults must be undone by the test)."""
    lab = start_phone(adb_server, tmp_path_factory.mktemp("adb-phone-module"), "phone", None)
    try:
        yield lab
    finally:
        lab.phone.stop()


def _phones_of(item: pytest.Item) -> list[EmulatedPhone]:
    """The emulated phones a test used: its AdbPhoneLab fixtures and the ones its factory started."""
    phones = []
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, AdbPhoneLab):
            phones.append(value.phone)
        phones += [lab.phone for lab in getattr(value, "started", ()) if isinstance(lab, AdbPhoneLab)]
    return phones


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test on an emulated phone shows what the phone's adbd logged about its shells (a command
    killed, a stream hung up), so a kill nobody asked for leaves its trail in the report."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when != "call" or not report.failed:
        return
    for phone in dict.fromkeys(_phones_of(item)):
        events = phone.log_events()
        if events:
            report.sections.append((f"adbd log of {phone.serial}", "\n".join(events[-40:])))
