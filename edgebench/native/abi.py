"""Which build of a native runner a device gets: the one for its ABI, checked against the files' ELF
headers before anything is pushed.

A phone says its ABIs (`ro.product.cpu.abi` and `abilist`, in the shell fingerprint); a board without
getprop says its `uname -m`, mapped onto the same names. A runner given per ABI (`builds`) is picked by
them, its own ABI first; a runner given as one file is checked: an x86-64 benchmark.out pushed to an
aarch64 phone would otherwise end as a bare "not found" (no x86-64 loader there) or, worse, run on an
emulator's host. Files that are not ELF (a shell wrapper) are not checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..descriptors import ABI_OF_ARCH, RunnerSpec
from ..errors import UserError

# e_machine of each ABI's binaries (the ELF specification's numbers)
ELF_MACHINE = {"arm64-v8a": 0xB7, "armeabi-v7a": 0x28, "x86_64": 0x3E, "x86": 0x03, "riscv64": 0xF3}
MACHINE_NAME = {0xB7: "aarch64", 0x28: "32-bit Arm", 0x3E: "x86-64", 0x03: "x86", 0xF3: "RISC-V"}


def device_abis(fingerprint: Mapping[str, Any]) -> tuple[str, ...]:
    """The ABIs a device runs, its own first: getprop's list where the device has one, else its
    `uname -m` as an ABI name; () when the fingerprint says neither."""
    listed = [a.strip() for a in str(fingerprint.get("abilist") or "").split(",") if a.strip()]
    own = str(fingerprint.get("abi") or "").strip()
    if own or listed:
        return tuple(dict.fromkeys([own, *listed] if own else listed))
    abi = ABI_OF_ARCH.get(str(fingerprint.get("arch") or "").strip().lower())
    return (abi,) if abi else ()


def elf_machine(path: Path) -> int | None:
    """e_machine of an ELF file (16 bits at offset 18, in the file's byte order), None for any other file."""
    with open(path, "rb") as fh:
        head = fh.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    return int.from_bytes(head[18:20], "big" if head[5] == 2 else "little")


def runner_for_device(runner: RunnerSpec, abis: tuple[str, ...], device: str, source: str) -> RunnerSpec:
    """`runner` as this device gets it: its build for the device's ABI, every ELF file of it built for an
    ABI the device runs; a one-line UserError naming the file, its machine and the device's ABI."""
    where = f"{source}: runners.{runner.name}"
    picked = runner.for_abi(abis)
    if picked is None:
        offered = ", ".join(b.abi for b in runner.builds)
        said = ", ".join(abis) or "unknown (no getprop ro.product.cpu.abi, no uname -m)"
        raise UserError(f"{where}: builds for {offered}; {device} runs {said}")
    if not picked.host_path or not abis:
        return picked
    runs = {ELF_MACHINE[a] for a in abis if a in ELF_MACHINE}
    for file in [picked.host_path, *picked.libs]:
        path = Path(file).expanduser()
        machine = elf_machine(path) if path.is_file() else None
        if machine is not None and runs and machine not in runs:
            built = MACHINE_NAME.get(machine, f"ELF machine {machine:#x}")
            raise UserError(
                f"{where}: {path} is built for {built}, {device} runs {', '.join(abis)}: push its "
                f"{abis[0]} build (or give one per ABI: runners.{runner.name}.builds.{abis[0]})"
            )
    return picked
