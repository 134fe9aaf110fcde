"""A job's identity is relative to its suite and follows the content of the files it reads: the same suite
in another checkout makes the same keys (so a resume there skips the done jobs); a model changed under the
same name makes new keys (so it is re-measured) and is flagged; a resume refuses a run whose controller is
still alive."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgebench.errors import UserError
from edgebench.execution.fleet import (
    changed_model_notes,
    changed_models,
    check_resumable,
    controller_alive,
    controller_identity,
)
from edgebench.execution.suite import load_suite, model_digests, plan
from edgebench.results.store import RunInfo

SUITE = """
name = "ident"
devices = ["local"]
models = ["models/a.onnx", {name = "b", path = "models/b.onnx"}]
[[probe]]
kind = "bench"
params = { threads = [1, 2] }
[[probe]]
kind = "accuracy"
models = ["b"]
params = { reference = "a", inputs = ["data/x.npz", "data/missing.npz"] }
"""


def tiny_model(path: Path, seed: int) -> None:
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], np.random.default_rng(seed).standard_normal(16))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)


def checkout(root: Path) -> Path:
    tiny_model(root / "models" / "a.onnx", 1)
    tiny_model(root / "models" / "b.onnx", 2)
    (root / "data").mkdir()
    np.savez(root / "data" / "x.npz", x=np.ones((1, 4), dtype="float32"))
    (root / "suite.toml").write_text(SUITE)
    return root / "suite.toml"


def keys(suite_path: Path) -> list[str]:
    return [j.key for j in plan(load_suite(suite_path))]


def test_the_same_suite_in_another_checkout_makes_the_same_keys(tmp_path: Path) -> None:
    first = checkout(tmp_path / "one")
    shutil.copytree(tmp_path / "one", tmp_path / "elsewhere" / "two")
    second = tmp_path / "elsewhere" / "two" / "suite.toml"
    jobs = plan(load_suite(first))
    assert len(jobs) == 2 * 2 + 2
    assert keys(first) == keys(second)
    accuracy = [j for j in jobs if j.probe == "accuracy"]
    for job in accuracy:  # absolute paths in params (what the probe opens) never reach the key
        assert str(tmp_path) in job.params["reference"]
        assert job.identity["reference"].startswith("sha256:")
    inputs = sorted(j.identity["inputs"] for j in accuracy)
    assert inputs[0] == "path:data/missing.npz" and inputs[1].startswith("sha256:")


def test_a_model_changed_under_the_same_name_makes_new_keys_for_its_jobs(tmp_path: Path) -> None:
    suite_path = checkout(tmp_path)

    def by_what(jobs: list) -> dict:
        return {
            (j.model.name, j.probe, str(j.params.get("threads")), j.params.get("inputs")): j.key for j in jobs
        }

    before = by_what(plan(load_suite(suite_path)))
    digests = model_digests(load_suite(suite_path))
    tiny_model(tmp_path / "models" / "b.onnx", 3)  # a new build of b
    after_jobs = plan(load_suite(suite_path))
    after = by_what(after_jobs)
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {k for k in before if k[0] == "b"}

    now = model_digests(load_suite(suite_path))
    flagged = changed_models({"models": digests}, now)
    assert set(flagged) == {"b"} and flagged["b"] == (digests["b"], now["b"])
    notes = changed_model_notes(after_jobs, set(before.values()), flagged, "run-1")
    assert set(notes) == {j.key for j in after_jobs if j.model and j.model.name == "b"}
    assert all("model 'b' changed since run run-1 measured it" in n[0] for n in notes.values())
    # the latest resume's record is what counts
    assert changed_models({"models": digests, "resumes": [{"models": now}]}, now) == {}


def run_info(status: str, controller: dict) -> RunInfo:
    return RunInfo("run-1", "t", "suite", "ident", {"controller": controller}, status, None)


def test_resume_refuses_a_run_whose_controller_is_alive(tmp_path: Path) -> None:
    suite = load_suite(checkout(tmp_path))
    me = controller_identity()
    assert controller_alive(me)
    with pytest.raises(UserError, match=rf"run run-1 is still running \(controller pid {os.getpid()} on"):
        check_resumable(run_info("running", me), suite)
    check_resumable(run_info("interrupted", me), suite)  # it says it ended: fine
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = {**me, "pid": int(gone.stdout)}
    assert not controller_alive(dead)
    check_resumable(run_info("running", dead), suite)  # killed with -9: resumable
    assert not controller_alive({**me, "started": me["started"] - 100})  # a reused pid is another process
    provenance = {"controller": dead, "resumes": [{"controller": me}]}
    resumed = RunInfo("run-1", "t", "suite", "ident", provenance, "running", None)
    with pytest.raises(UserError, match="still running"):
        check_resumable(resumed, suite)  # the latest resume's controller is the one that counts
    with pytest.raises(UserError, match="made by suite 'other'"):
        check_resumable(RunInfo("run-1", "t", "suite", "other", {}, "failed", None), suite)
