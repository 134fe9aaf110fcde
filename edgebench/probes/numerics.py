"""Host-side pieces the numerics probes share: files to and from the device, deterministic .npz files,
and running a model on the device for its outputs (saved to an .npz there and pulled)."""

from __future__ import annotations

import io
import os
import posixpath
import secrets
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TransferError, UserError
from ..jobs import Job, ModelRef
from ..lab.device import Device
from .common import check_runtime, job_timeout, model_file_for, shape_lists
from .registry import AccuracyParams

_EPOCH = (2020, 1, 1, 0, 0, 0)


def runtime_for(model: ModelRef, requested: str | None) -> str:
    """The runtime a model file runs on: the requested one when it runs the file's format, else the
    format's own (`check_runtime`)."""
    return check_runtime(model, requested)


def write_npz(path: Path, arrays: dict[str, Any]) -> Path:
    """An uncompressed .npz with fixed timestamps: the same arrays give the same bytes (and cache hits)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            zf.writestr(zipfile.ZipInfo(f"{name}.npy", _EPOCH), buf.getvalue())
    os.replace(tmp, path)
    return path


def read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: np.array(data[k]) for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise UserError(f"{path}: not a readable .npz file ({exc})") from None


def remote_tmp(device: Device, suffix: str) -> str:
    """A fresh path under the device's WORKDIR/tmp."""
    return posixpath.join(device.spec.workdir, "tmp", f"eb-{secrets.token_hex(6)}{suffix}")


def remote_tmp_dir(device: Device) -> str:
    return posixpath.join(device.spec.workdir, "tmp")


def pull(device: Device, remote: str, local: Path, timeout: float) -> Path:
    """Pull a file the agent wrote, then remove it from the device (it is scratch, not cache)."""
    try:
        device.transport.pull(remote, local, timeout=timeout)
    finally:
        remove_remote(device, [remote], timeout)
    if not local.is_file():
        raise TransferError(f"pull {remote}: nothing arrived", device=device.name)
    return local


def remove_remote(device: Device, paths: list[str], timeout: float) -> None:
    """Best effort: scratch files left behind are harmless, a failed clean-up must not fail the job."""
    paths = [p for p in paths if p]
    if not paths:
        return
    try:
        device.transport.run(["rm", "-f", "--", *paths], timeout=min(timeout, 60.0))
    except Exception:  # noqa: BLE001 - clean-up only
        pass


@dataclass
class DeviceOutputs:
    """Outputs of one model run on a device, pulled to the host."""

    arrays: dict[str, np.ndarray]
    order: list[str]
    runtime_version: str
    warnings: list[str] = field(default_factory=list)
    inputs_remote: str | None = None  # the inputs .npz the agent saved on the device, when asked to
    placement: dict[str, Any] = field(default_factory=dict)  # where it ran (agent.placement)


@dataclass(frozen=True)
class OnBackend:
    """The backend a model runs on for its outputs, at a precision (None: the backend's own)."""

    name: str = "cpu"
    precision: str | None = None

    def text(self) -> str:
        return self.name + (f" ({self.precision})" if self.precision else "")


CPU_FP32 = OnBackend("cpu", "fp32")


def device_outputs(
    device: Device,
    model: ModelRef,
    runtime: str,
    job: Job,
    remote_inputs: str | None,
    save_inputs: bool,
    workdir: Path,
    every_tensor: bool = False,
    on: OnBackend | None = None,
) -> DeviceOutputs:
    """Push the model, run it once on the device, pull its outputs .npz (`every_tensor`: every tensor the
    runtime can name, as an ncnn graph's blobs), on backend `on` (default: the CPU at its default)."""
    params = AccuracyParams.of(job)
    timeout = job_timeout(device, job)
    remote_model = device.ensure_model(model_file_for(model, runtime, params.shapes), timeout)
    out = remote_tmp(device, ".npz")
    inputs_out = remote_tmp(device, ".inputs.npz") if save_inputs else None
    task = {
        "kind": "outputs",
        "runtime": runtime,
        "model": remote_model,
        "threads": params.threads,
        "shapes": shape_lists(params.shapes),
        "seed": params.seed,
        "inputs": remote_inputs,
        "out": out,
        "inputs_out": inputs_out,
        "per_op": every_tensor,
        **({"backend": on.name, "precision": on.precision} if on is not None else {}),
    }
    try:
        reply = device.run_agent(task, timeout)
    except Exception:
        remove_remote(device, [out, inputs_out or ""], timeout)
        raise
    local = pull(device, out, workdir / f"{secrets.token_hex(4)}.npz", timeout)
    arrays = read_npz(local)
    r = reply.result
    return DeviceOutputs(
        arrays,
        list(r.get("output_order") or arrays),
        str(r.get("runtime_version", "")),
        list(reply.warnings),
        inputs_out,
        dict(r.get("placement") or {}),
    )


def scratch_dir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="edgebench-")
