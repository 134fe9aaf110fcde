"""Device descriptors load strictly: unknown or mistyped keys name the file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgebench.descriptors import load_lab
from edgebench.errors import ConfigError, UserError


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def test_local_exists_without_a_lab_folder(tmp_path: Path) -> None:
    lab = load_lab(tmp_path / "missing")
    assert lab.names() == ["local"]
    assert lab.get("local").transport == "local"


def test_full_descriptor_is_parsed(tmp_path: Path) -> None:
    write(
        tmp_path,
        "pixel8",
        """
name = "pixel8"
transport = "adb"
serial = "37281FDJH000XY"
workdir = "/data/local/tmp/edgebench"
python = "python3"
soc = "Tensor G3"
timeout = 120
[spec]
memory_bandwidth_gbps = 68.2
peak_tops = { fp32 = 1.2, fp16 = 2.4, int8 = 27 }
cpu_clusters = { little = [0,1,2,3], mid = [4,5,6], big = [7] }
[sensors]
sysfs_root = "/"
thermal_zones = "auto"
power = { current = "/sys/class/power_supply/battery/current_now", voltage = "/sys/class/power_supply/battery/voltage_now" }
""",
    )
    dev = load_lab(tmp_path).get("pixel8")
    assert dev.serial == "37281FDJH000XY" and dev.timeout_s == 120.0
    assert dev.spec.peak_tops == {"fp32": 1.2, "fp16": 2.4, "int8": 27.0}
    assert dev.spec.cpu_clusters["big"] == (7,)
    assert dev.sensors.power.current.endswith("current_now")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('transport = "adb"\nserial = "x"\nserail = "y"\n', "serail: unknown key"),
        ('transport = "ssh"\nhost = "h"\nport = "22"\n', "port: expected integer"),
        ('transport = "carrier-pigeon"\n', "transport: must be one of"),
        ('transport = "ssh"\n', "host: required"),
        ('transport = "adb"\nserial = "x"\n[spec]\npeak_tops = { fp64 = 1.0 }\n', "spec.peak_tops.fp64"),
        ('transport = "adb"\nserial = "x"\n[spec]\nbogus = 1\n', "spec.bogus: unknown key"),
        ('transport = "adb"\nserial = "x"\n[sensors]\npower = { amps = "/x" }\n', "sensors.power.amps"),
        ('transport = "adb"\nserial = "x"\ntimeout = true\n', "timeout: expected number, got a boolean"),
        ('transport = "adb"\nserial = "x\n', "malformed TOML"),
    ],
)
def test_bad_descriptor_names_file_and_key(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, "board", text)
    with pytest.raises(ConfigError) as info:
        load_lab(tmp_path)
    message = str(info.value)
    assert str(path) in message and fragment in message
    assert "\n" not in message


def test_duplicate_names_are_refused(tmp_path: Path) -> None:
    write(tmp_path, "a", 'name = "same"\ntransport = "local"\n')
    write(tmp_path, "b", 'name = "same"\ntransport = "local"\n')
    with pytest.raises(ConfigError, match="already defined"):
        load_lab(tmp_path)


def test_unknown_device_lists_known_ones(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown device 'nope'.*known: local"):
        load_lab(tmp_path).get("nope")
