"""A native runner's build per ABI: read strictly from the descriptor, picked by the device's ABI, and a
file built for another machine refused before any push."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgebench.descriptors import load_lab
from edgebench.errors import ConfigError, UserError
from edgebench.native.abi import device_abis, elf_machine, runner_for_device


def elf(path: Path, machine: int) -> Path:
    """A 64-bit little-endian ELF header with `machine` (enough for e_machine to be read)."""
    path.write_bytes(b"\x7fELF\x02\x01\x01" + b"\x00" * 11 + machine.to_bytes(2, "little") + b"\x00" * 44)
    return path


def lab_with(tmp_path: Path, runners: str) -> Path:
    folder = tmp_path / "lab"
    folder.mkdir(exist_ok=True)
    (folder / "phone.toml").write_text(
        'name = "phone"\ntransport = "adb"\nserial = "S"\nagent = "native"\n'
        'workdir = "/data/local/tmp/e"\n' + runners
    )
    return folder


def test_builds_per_abi_are_read_and_picked_by_the_devices_abi(tmp_path: Path) -> None:
    arm, x86 = elf(tmp_path / "arm", 0xB7), elf(tmp_path / "x86", 0x3E)
    lab = lab_with(
        tmp_path,
        '[runners.mnn_benchmark]\npath = "benchmark.out"\n'
        f'[runners.mnn_benchmark.builds.aarch64]\npush = "{arm}"\nlibs = ["{arm}"]\n'
        f'[runners.mnn_benchmark.builds.x86_64]\npush = "{x86}"\n',
    )
    runner = load_lab(lab).get("phone").runners["mnn_benchmark"]
    assert runner.pushed and [b.abi for b in runner.builds] == ["arm64-v8a", "x86_64"]  # aarch64 named so
    picked = runner_for_device(runner, ("arm64-v8a", "armeabi-v7a"), "phone", "phone.toml")
    assert (picked.host_path, picked.libs, picked.path) == (str(arm), (str(arm),), "benchmark.out")
    assert runner_for_device(runner, ("x86_64", "x86"), "phone", "phone.toml").host_path == str(x86)
    with pytest.raises(
        UserError, match=r"runners.mnn_benchmark: builds for arm64-v8a, x86_64; phone runs riscv64"
    ):
        runner_for_device(runner, ("riscv64",), "phone", "phone.toml")


def test_a_single_build_for_another_machine_is_refused_naming_the_file(tmp_path: Path) -> None:
    x86 = elf(tmp_path / "benchmark.out", 0x3E)
    script = tmp_path / "wrapper.sh"
    script.write_text("#!/bin/sh\n")
    lab = lab_with(
        tmp_path, f'[runners]\nmnn_benchmark = {{ path = "b", push = "{script}", libs = ["{x86}"] }}\n'
    )
    runner = load_lab(lab).get("phone").runners["mnn_benchmark"]
    with pytest.raises(UserError) as err:
        runner_for_device(runner, ("arm64-v8a",), "phone", "phone.toml")
    assert f"{x86} is built for x86-64, phone runs arm64-v8a" in str(err.value)
    assert runner_for_device(runner, ("x86_64", "x86"), "phone", "phone.toml") is runner
    assert runner_for_device(runner, (), "phone", "phone.toml") is runner  # ABI unknown: nothing to check
    assert elf_machine(script) is None


@pytest.mark.parametrize(
    ("runners", "fragment"),
    [
        (
            '[runners.b]\npath = "b"\n[runners.b.builds.mips]\npush = "x"\n',
            "runners.b.builds.mips: not an ABI",
        ),
        (
            '[runners.b]\npath = "b"\npush = "x"\n[runners.b.builds.x86_64]\npush = "y"\n',
            "runners.b.builds: give either push and libs",
        ),
        (
            '[runners.b]\npath = "b"\n[runners.b.builds.x86_64]\npush = "y"\nlib = []\n',
            "runners.b.builds.x86_64.lib",
        ),
        (
            '[runners.b]\npath = "b"\n[runners.b.builds.aarch64]\npush = "y"\n[runners.b.builds.arm64-v8a]\n'
            'push = "z"\n',
            "a second build for arm64-v8a",
        ),
    ],
)
def test_bad_builds_name_the_file_and_key(tmp_path: Path, runners: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match="phone.toml") as err:
        load_lab(lab_with(tmp_path, runners))
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("fingerprint", "abis"),
    [
        ({"abi": "arm64-v8a", "abilist": "arm64-v8a,armeabi-v7a,armeabi", "arch": "aarch64"},
         ("arm64-v8a", "armeabi-v7a", "armeabi")),
        ({"abi": None, "abilist": None, "arch": "aarch64"}, ("arm64-v8a",)),
        ({"arch": "x86_64"}, ("x86_64",)),
        ({"arch": "mips"}, ()),
    ],
)  # fmt: skip
def test_device_abis_from_getprop_else_uname(fingerprint: dict, abis: tuple[str, ...]) -> None:  # type: ignore[type-arg]
    assert device_abis(fingerprint) == abis
