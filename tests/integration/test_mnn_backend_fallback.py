"""MNN's silent fallback, caught on real parts: pymnn (the PyPI wheel has the CPU alone) asked for OpenCL or
Vulkan prints "Can't Find type=N backend, use 0 instead" and runs on the CPU; the lab's OpenCL+Vulkan
`benchmark.out` (../shared/lab-tools/mnn-3.6.1-linux-x86_64-gpu, BUILD.md there) runs forward 7 on Mesa's
lavapipe for real, and with the Vulkan loader hidden or no Vulkan driver falls back the same way. Each is
recorded where it ran (the line its evidence, a warning), never as the backend asked; `--require-backend`
fails it (exit 1, one line, nothing stored lost). And what MNN's low precision computes in on x86 (fp32),
measured against the fp32 outputs.

Behaviour only: the lavapipe run is checked to be much slower than the same tool on the CPU (it really ran
on the Vulkan device: 13-42x measured here), not held to a band.
"""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path

import pytest

from edgebench.testing.cli import edgebench
from edgebench.testing.labtools import in_ci, tool_or_skip

pytestmark = pytest.mark.integration
pytest.importorskip("MNN", reason="MNN is not installed (pip install -e .)")

GPU_TOOL = "mnn-3.6.1-linux-x86_64-gpu"
RUNS = ["--runs", "10", "--warmup", "2", "--timeout", "240"]
LOADER_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")
LAVAPIPE_ICD = Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")  # Debian's mesa-vulkan-drivers
SLOWER = 2.0  # lavapipe's Vulkan over the CPU: 13-42x measured; anything near 1 ran on the CPU


def records_of(res: subprocess.CompletedProcess[str]) -> list[dict]:
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)["records"]


def latency(records: list[dict], stat: str) -> dict:
    return next(r for r in records if r["metric"] == "latency_ms" and r["params"].get("stat") == stat)


def one_error_line(res: subprocess.CompletedProcess[str]) -> str:
    """The one `edgebench: error:` line of a failed run; never a traceback."""
    assert "Traceback" not in res.stderr, res.stderr
    [line] = [ln for ln in res.stderr.splitlines() if ln.startswith("edgebench: error:")]
    return line


def stored(run_id: str, cwd: Path) -> list[dict]:
    res = edgebench("results", "--run", run_id, "--json", cwd=cwd)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["records"]


# ---- pymnn in the agent --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("backend", "code"), [("opencl", 3), ("vulkan", 7)])
def test_pymnn_gpu_backend_is_a_fallback_recorded_as_cpu_and_strict_mode_refuses_it(
    backend: str, code: int, tmp_path: Path
) -> None:
    bench = [
        "bench",
        "builtin:convnet",
        "--runtime",
        "mnn",
        "--backend",
        backend,
        *RUNS,
        "--min-seconds",
        "0",
    ]
    res = edgebench(*bench, "--json", cwd=tmp_path)
    records = records_of(res)
    line = f"Can't Find type={code} backend, use 0 instead"
    timed = [r for r in records if r["metric"] == "latency_ms"]
    for r in timed:
        assert r["params"]["backend"] == backend and r["annotations"]["backend_actual"] == "cpu"
        assert (
            r["annotations"]["placement"]["actual"] == "cpu"
            and line in r["annotations"]["placement"]["evidence"]
        )
    assert not any(r.get("annotations", {}).get("backend_actual") == backend for r in records)
    assert f"asked for {backend}, ran on cpu" in res.stderr and line in res.stderr
    run_id = timed[0]["run_id"]
    before = stored(run_id, tmp_path)

    strict = edgebench(*bench, "--require-backend", "--json", cwd=tmp_path)
    assert strict.returncode == 1, strict.stderr
    error = one_error_line(strict)
    assert (
        f"the backend is required: {backend} was asked for; the model ran on cpu" in error and line in error
    )
    assert json.loads(strict.stdout)["records"] == []
    assert stored(run_id, tmp_path) == before  # nothing stored lost


def test_pymnn_cpu_is_unchanged(tmp_path: Path) -> None:
    res = edgebench(
        "bench", "builtin:convnet", "--runtime", "mnn", *RUNS, "--min-seconds", "0", "--json", cwd=tmp_path
    )
    p50 = latency(records_of(res), "p50")
    placement = p50["annotations"]["placement"]
    # the CPU at its default is the identity records had before backends existed: no backend param
    assert p50["params"].get("backend", "cpu") == "cpu" and p50["annotations"]["backend_actual"] == "cpu"
    assert placement["actual"] == "cpu" and placement["precision"] == {
        "mode": "fp32",
        "mnn_precision": "normal",
    }
    assert "warning: local: asked for" not in res.stderr


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"), reason="the claim is x86's: no fp16 kernels"
)
def test_pymnn_low_precision_computes_in_fp32_on_x86(tmp_path: Path) -> None:
    """`--precision fp16` is MNN's Low, recorded with what it computed in: fp32 on x86 (its AVX2 backend
    has no fp16 kernels), backed by the outputs: Low against Normal (fp32) on the same inputs, measured
    bit-identical here (max abs error 0.0; fp16 arithmetic would differ by ~1e-3 relative)."""
    res = edgebench(
        "bench", "builtin:convnet", "--runtime", "mnn", "--precision", "fp16", *RUNS, "--min-seconds", "0",
        "--json", cwd=tmp_path,
    )  # fmt: skip
    p50 = latency(records_of(res), "p50")
    assert p50["params"]["precision"] == "fp16"
    assert p50["annotations"]["placement"]["precision"] == {"mode": "fp32", "mnn_precision": "low"}
    res = edgebench(
        "accuracy", "builtin:convnet", "--runtime", "mnn", "--backend", "cpu", "--precision", "fp16",
        "--json", cwd=tmp_path,
    )  # fmt: skip
    got = {r["metric"]: r for r in records_of(res)}
    print(
        f"\nMNN Low vs Normal on x86: max abs {got['max_abs_err']['value']}, cosine {got['cosine']['value']}"
    )
    assert got["max_abs_err"]["value"] <= 1e-6 and got["cosine"]["value"] >= 1 - 1e-9
    assert got["max_abs_err"]["annotations"]["placement"]["precision"]["mode"] == "fp32"


# ---- the OpenCL+Vulkan benchmark.out ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpu_tool() -> Path:
    return tool_or_skip(
        Path(__file__).resolve().parents[2], GPU_TOOL, "benchmark.out", "MNN benchmark.out (GPU)"
    )


@pytest.fixture(scope="module")
def vulkan_loader(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding `libvulkan.so` (the unversioned name MNN's Vulkan backend dlopens; Debian ships it
    only in libvulkan-dev) linked to the system's loader, whose device here is Mesa's lavapipe."""
    found = next(
        (Path(d) / "libvulkan.so.1" for d in LOADER_DIRS if (Path(d) / "libvulkan.so.1").exists()), None
    )
    if found is None or not LAVAPIPE_ICD.exists():
        why = "Vulkan on lavapipe needs Debian's libvulkan1 and mesa-vulkan-drivers"
        if in_ci():
            pytest.fail(why)
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("loader")
    (folder / "libvulkan.so").symlink_to(found)
    return folder


def gpu_lab(folder: Path, tool: Path, devices: dict[str, dict[str, str]]) -> Path:
    """Native devices on this host running the lab's GPU benchmark.out in place, each with its own
    environment (the backend libraries preloaded, as BUILD.md says, the loader shown or hidden)."""
    lab = folder / "lab"
    lab.mkdir()
    for name, env in devices.items():
        table = ", ".join(f'{k} = "{v}"' for k, v in {"LD_LIBRARY_PATH": str(tool), **env}.items())
        (lab / f"{name}.toml").write_text(
            f'name = "{name}"\ntransport = "local"\nagent = "native"\nworkdir = "{folder / name}"\n'
            f"env = {{ {table} }}\n[runners]\n"
            f'mnn_benchmark = {{ path = "{tool / "benchmark.out"}" }}\n'
        )
    return lab


def native_bench(lab: Path, device: str, cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return edgebench(
        "bench", "builtin:convnet", "--runtime", "mnn", "--device", device, "--lab", str(lab), *RUNS, *extra,
        cwd=cwd,
    )  # fmt: skip


def test_native_vulkan_on_lavapipe_is_recorded_as_vulkan(
    gpu_tool: Path, vulkan_loader: Path, tmp_path: Path
) -> None:
    """Forward 7 with the loader on the path and lavapipe as the one driver: recorded as vulkan, strict mode
    passes it, and its mean is far above the same tool's on the CPU (it really ran on the Vulkan device)."""
    vulkan = {
        "LD_LIBRARY_PATH": f"{gpu_tool}:{vulkan_loader}",
        "LD_PRELOAD": str(gpu_tool / "libMNN_Vulkan.so"),
        "VK_ICD_FILENAMES": str(LAVAPIPE_ICD),
    }
    lab = gpu_lab(tmp_path, gpu_tool, {"lvp": vulkan, "cpu": {}})
    res = native_bench(lab, "lvp", tmp_path, "--delegate", "vulkan", "--require-backend", "--json")
    mean = latency(records_of(res), "mean")
    assert mean["params"]["backend"] == "vulkan" and mean["annotations"]["path"] == "vulkan"
    placed = mean["annotations"]["placement"]  # the agent's shape: the report and the gate read it
    assert (placed["requested"], placed["actual"], mean["annotations"]["backend_actual"]) == ("vulkan",) * 3
    assert "no 'Can't Find type=7 backend' line" in mean["annotations"]["placement_evidence"]
    assert "recorded as cpu" not in res.stderr
    cpu = latency(records_of(native_bench(lab, "cpu", tmp_path, "--threads", "2", "--json")), "mean")
    assert cpu["params"]["backend"] == "cpu" and cpu["annotations"]["path"] == "cpu"
    ratio = mean["value"] / cpu["value"]
    print(
        f"\nbenchmark.out vulkan (lavapipe) {mean['value']:.3f} ms, cpu {cpu['value']:.3f} ms: {ratio:.1f}x"
    )
    assert ratio > SLOWER, (mean["value"], cpu["value"])


@pytest.mark.parametrize(
    ("case", "asked", "reason"),
    [
        ("no_loader", "vulkan", "Load vulkan library error: libvulkan.so: cannot open shared object file"),
        ("no_icd", "vulkan", "Invalide device for support vulkan"),
        ("opencl", "opencl", "OpenCL init error, fallback"),
    ],
)
def test_native_backend_that_cannot_start_is_recorded_as_cpu_and_strict_mode_fails(
    case: str, asked: str, reason: str, gpu_tool: Path, vulkan_loader: Path, tmp_path: Path
) -> None:
    """The backend's library preloaded but its driver missing: the Vulkan loader hidden (libvulkan.so not on
    the path), no Vulkan driver (VK_ICD_FILENAMES at a file that does not exist), or no OpenCL at all.
    libMNN says why, prints its fallback line and runs on the CPU: recorded as cpu with both lines as
    evidence and a warning; required, the job fails in one line and what was stored stays."""
    envs = {
        "no_loader": {"LD_PRELOAD": str(gpu_tool / "libMNN_Vulkan.so")},
        "no_icd": {
            "LD_LIBRARY_PATH": f"{gpu_tool}:{vulkan_loader}",
            "LD_PRELOAD": str(gpu_tool / "libMNN_Vulkan.so"),
            "VK_ICD_FILENAMES": "/nonexistent.json",
        },
        "opencl": {"LD_PRELOAD": str(gpu_tool / "libMNN_CL.so")},
    }
    if case == "no_loader" and any((Path(d) / "libvulkan.so").exists() for d in LOADER_DIRS):
        pytest.skip(
            "libvulkan.so is on the system's library path (libvulkan-dev): the loader cannot be hidden"
        )
    lab = gpu_lab(tmp_path, gpu_tool, {case: envs[case]})
    res = native_bench(lab, case, tmp_path, "--delegate", asked, "--json")
    mean = latency(records_of(res), "mean")
    line = f"Can't Find type={ {'vulkan': 7, 'opencl': 3}[asked] } backend, use 0 instead"
    evidence = mean["annotations"]["placement_evidence"]
    assert mean["params"]["backend"] == "cpu" and mean["annotations"]["path"] == "cpu"
    placed = mean["annotations"]["placement"]
    assert (placed["requested"], placed["actual"]) == (asked, "cpu") and line in placed["evidence"], placed
    assert mean["annotations"]["delegate_asked"] == asked and reason in evidence and line in evidence
    assert f"asked for {asked}, but libMNN has no {asked} backend it can start" in res.stderr
    before = stored(mean["run_id"], tmp_path)

    strict = native_bench(lab, case, tmp_path, "--delegate", asked, "--require-backend", "--json")
    assert strict.returncode == 1, strict.stderr
    error = one_error_line(strict)
    assert f"{case}: mnn_benchmark: {asked} is required" in error and reason in error and line in error
    assert stored(mean["run_id"], tmp_path) == before
